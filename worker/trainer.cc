#include "worker/trainer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/data/partition.h"

namespace cserps {
double Accuracy(const EvalSums& sums) {
  return static_cast<double>(sums.correct) / std::max<size_t>(1, sums.count);
}

std::string SummaryBaseName(const v1::JobConfig& config, uint32_t rank,
                            uint32_t local_rank) {
  if (config.cluster().local_size() == 1) return absl::StrCat("worker_", rank);
  return absl::StrCat("worker_", rank, "_", local_rank);
}

uint64_t TrainingFloatsPushed(const PsClient& client) {
  uint64_t floats =
      client.sparse_traffic().floats_pushed + client.async_traffic().floats_pushed;
  for (v1::Stream s : {v1::GRAD, v1::MODEL}) floats += client.traffic(s).floats_pushed;
  return floats;
}

namespace {

// The learning-curve row of the epoch that just ended (epoch is 1-based),
// logged as the epoch's progress line.
CurvePoint EndOfEpoch(uint64_t epoch, uint64_t step, double train_loss_sum,
                      size_t steps_per_epoch, const EvalSums& test, double wall_seconds,
                      const PsClient& client, const std::string& log_prefix) {
  CurvePoint point;
  point.epoch = epoch;
  point.step = step;
  point.train_loss = train_loss_sum / steps_per_epoch;
  point.test_loss = test.loss_sum / std::max<size_t>(1, test.count);
  point.test_accuracy = Accuracy(test);
  point.wall_seconds = wall_seconds;
  point.bytes_pushed = client.bytes_pushed();
  point.bytes_pulled = client.bytes_pulled();
  spdlog::info("{}epoch {} done: train loss {:.4f} test loss {:.4f} test accuracy {:.2f}% ({:.1f} s)",
               log_prefix, point.epoch, point.train_loss, point.test_loss,
               100 * point.test_accuracy, point.wall_seconds);
  return point;
}

void LogStep(const std::string& log_prefix, uint64_t step, uint64_t epoch, float loss,
             float lr, double samples_per_second, const PsClient& client) {
  spdlog::info("{}step {} epoch {} loss {:.4f} lr {:.4g} samples/s {:.0f} pushed {:.1f} MB pulled {:.1f} MB",
               log_prefix, step, epoch, loss, lr, samples_per_second,
               client.bytes_pushed() / 1e6, client.bytes_pulled() / 1e6);
}

}  // namespace

absl::Status RunEpochs(const EpochLoop& loop, absl::Time start,
                       const std::function<absl::StatusOr<float>()>& step,
                       const std::function<absl::StatusOr<EvalSums>()>& evaluate,
                       std::vector<CurvePoint>* curve) {
  const uint32_t log_every = loop.config->log_every_steps();
  uint64_t steps_done = 0;
  absl::Time window_start = start;
  uint64_t window_steps = 0;
  for (uint64_t epoch = 0; epoch < loop.config->epochs(); ++epoch) {
    double loss_sum = 0;
    for (size_t i = 0; i < loop.steps_per_epoch; ++i) {
      ASSIGN_OR_RETURN(const float loss, step());
      loss_sum += loss;
      ++steps_done;
      ++window_steps;
      if (log_every != 0 && steps_done % log_every == 0) {
        const absl::Time now = absl::Now();
        const double seconds = absl::ToDoubleSeconds(now - window_start);
        LogStep(loop.log_prefix, steps_done, epoch, loss, loop.schedule->At(steps_done - 1),
                seconds > 0 ? window_steps * loop.batch_size / seconds : 0.0, *loop.client);
        window_start = now;
        window_steps = 0;
      }
    }
    ASSIGN_OR_RETURN(const EvalSums test, evaluate());
    curve->push_back(EndOfEpoch(epoch + 1, steps_done, loss_sum, loop.steps_per_epoch, test,
                                absl::ToDoubleSeconds(absl::Now() - start), *loop.client,
                                loop.log_prefix));
  }
  return absl::OkStatus();
}

absl::Status EndCompute(float slowdown, absl::Time compute_start, float loss,
                        const TrainerLink& link, uint64_t step) {
  if (slowdown > 1.0f) absl::SleepFor((slowdown - 1.0f) * (absl::Now() - compute_start));
  absl::Status status;
  if (!std::isfinite(loss)) {
    status = absl::InternalError(absl::StrCat("rank ", link.client->rank(), " step ", step,
                                              ": training loss is ", loss,
                                              " (diverged: lower optimizer.lr?)"));
  }
  if (link.group == nullptr) return status;
  return ShareStatus(*link.group, status, absl::StrCat("step ", step));
}

void RecordStep(WorkerMetrics& metrics, const PsClient& client, const StepTiming& timing,
                uint32_t batch_size, float loss, float lr, double compression) {
  const absl::Duration algorithm = absl::Now() - timing.algorithm_start;
  const absl::Duration communication =
      std::min(algorithm, client.wait_time() - timing.waited_before);
  metrics.RecordStep(timing.algorithm_start - timing.compute_start, communication,
                     algorithm - communication, batch_size, loss, lr);
  ReportTraffic(client, &metrics);
  metrics.SetCompressionRatio(compression);
}

void LogFinal(const std::string& log_prefix, const FinalReport& report) {
  spdlog::info("{}final: local model {:.2f}%, global model {:.2f}%, achieved compression {:.1f}x",
               log_prefix, 100 * report.local_accuracy, 100 * report.global_accuracy,
               report.achieved_compression);
}

uint32_t DataPartition(uint32_t rank, uint32_t local_rank, uint32_t local_size) {
  return rank * local_size + local_rank;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobConfig& config, PsClient* client, const Dataset* train,
    const Dataset* test, WorkerMetrics* metrics) {
  return Create(config, TrainerLink{client, nullptr}, train, test, metrics);
}

absl::StatusOr<TrainerPlan> PlanTrainer(const v1::JobConfig& config, const TrainerLink& link,
                                        size_t train_size) {
  const uint32_t local_size = config.cluster().local_size();
  if (link.group == nullptr && local_size != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", local_size,
        " but this worker has no local group: every node runs its ", local_size,
        " local ranks together (cserps-worker runs them as threads with "
        "--backend=cpu, or one process per GPU with --backend=cuda and "
        "--local_rank)"));
  }
  if (link.group != nullptr && link.group->size() != local_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", local_size, " but the local group has ",
        link.group->size(), " members"));
  }
  TrainerPlan plan;
  plan.rank = link.client->rank();
  plan.local_rank = link.group != nullptr ? link.group->local_rank() : 0;
  if (plan.rank >= config.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", plan.rank, " is not below cluster.num_workers (",
        config.cluster().num_workers(), ")"));
  }
  plan.partition = DataPartition(plan.rank, plan.local_rank, local_size);
  const std::vector<uint32_t> batch_sizes = RankBatchSizes(config);
  if (plan.partition >= batch_sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", plan.rank, " local rank ", plan.local_rank, " (data partition ",
        plan.partition, ") has no batch size: the job has ", batch_sizes.size(),
        " worker processes"));
  }
  plan.steps_per_epoch = StepsPerEpoch(train_size, batch_sizes);
  if (plan.steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: ", train_size, " training examples are too few for ",
        batch_sizes.size(), " worker processes with batch sizes of up to ",
        *std::max_element(batch_sizes.begin(), batch_sizes.end()),
        ": not one step per epoch"));
  }
  plan.batch_size = batch_sizes[plan.partition];
  plan.range = RankRange(train_size, batch_sizes, plan.partition);
  const BlockLayout& layout = link.client->layout();
  for (uint32_t s : GroupShards(layout.num_shards(), local_size, plan.local_rank)) {
    plan.shard_floats += layout.ShardSize(s);
  }
  if (link.group != nullptr) plan.log_prefix = absl::StrCat("local rank ", plan.local_rank, ": ");
  return plan;
}

absl::Status PushModel(const TrainerLink& link, absl::Span<const float> model) {
  if (link.group == nullptr) return link.client->PushModel(model);
  return PushNodeModel(*link.group, *link.client, model);
}

absl::Status PullModel(const TrainerLink& link, absl::Span<float> model, bool wait_for_init) {
  if (link.group == nullptr) return link.client->PullModel(model, wait_for_init);
  return PullNodeModel(*link.group, *link.client, model, wait_for_init);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobConfig& config, TrainerLink link, const Dataset* train,
    const Dataset* test, WorkerMetrics* metrics, std::unique_ptr<Model> model) {
  ASSIGN_OR_RETURN(TrainerPlan plan, PlanTrainer(config, link, train->size));
  if (model == nullptr) {
    ASSIGN_OR_RETURN(model, MakeCpuModel(config.model()));
  }
  if (model->spec().input_dim != train->dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.input_dim is ", model->spec().input_dim, " but the data has ",
        train->dim, " features per example"));
  }
  const BlockLayout& layout = link.client->layout();
  if (model->spec().num_params != layout.num_params()) {
    return absl::InternalError("model and client disagree on the model size");
  }
  const float weight = static_cast<float>(plan.batch_size);
  const size_t steps_per_epoch = plan.steps_per_epoch;
  std::unique_ptr<Trainer> trainer(
      new Trainer(config, link, std::move(plan), train, test, std::move(model)));
  if (link.group != nullptr) {
    trainer->hierarchical_ = std::make_unique<HierarchicalCommunicator>(
        trainer->config_, layout.num_params(), link.group, link.client);
    trainer->comm_ = trainer->hierarchical_.get();
  }
  AlgorithmContext context;
  context.config = &trainer->config_;
  context.comm = trainer->comm_;
  context.direction = &trainer->direction_;
  context.layout = &layout;
  context.weight = weight;
  context.steps_per_epoch = steps_per_epoch;
  ASSIGN_OR_RETURN(trainer->algorithm_,
                   DefaultAlgorithms().Create(config.algorithm().name(), context));
  trainer->metrics_ = metrics;
  return trainer;
}

Trainer::Trainer(const v1::JobConfig& config, TrainerLink link, TrainerPlan plan,
                 const Dataset* train, const Dataset* test, std::unique_ptr<Model> model)
    : config_(config),
      link_(link),
      plan_(std::move(plan)),
      client_(link.client),
      comm_(link.client),
      test_(test),
      model_(std::move(model)),
      batcher_(*train, plan_.range, plan_.batch_size, config.seed(), plan_.partition),
      direction_(config.optimizer(), model_->spec().num_params),
      schedule_(config.optimizer(), plan_.steps_per_epoch, config.epochs()),
      slowdown_(config.data().rank_slowdown_size() > 0
                    ? config.data().rank_slowdown(plan_.partition)
                    : 1.0f),
      x_(model_->spec().num_params),
      grad_(model_->spec().num_params) {}

absl::Status Trainer::InitializeModel() {
  if (plan_.rank == 0) {
    // Only local rank 0's model is pushed; every local rank joins the push.
    if (plan_.local_rank == 0) model_->Initialize(config_.seed(), absl::MakeSpan(x_));
    RETURN_IF_ERROR(PushModel(link_, x_));
  }
  return PullModel(link_, absl::MakeSpan(x_), /*wait_for_init=*/true);
}

absl::StatusOr<float> Trainer::Step() {
  const uint64_t index = step_ % plan_.steps_per_epoch;
  if (index == 0) batcher_.StartEpoch(step_ / plan_.steps_per_epoch);
  const Batch batch = batcher_.Get(index);
  StepTiming timing;
  timing.compute_start = absl::Now();
  const float loss = model_->LossAndGradient(x_, batch, absl::MakeSpan(grad_));
  RETURN_IF_ERROR(EndCompute(slowdown_, timing.compute_start, loss, link_, step_));
  timing.algorithm_start = absl::Now();
  timing.waited_before = client_->wait_time();
  const float lr = schedule_.At(step_);
  RETURN_IF_ERROR(algorithm_->Step(step_, lr, grad_, absl::MakeSpan(x_)));
  ++step_;
  if (metrics_ != nullptr) {
    RecordStep(*metrics_, *client_, timing, plan_.batch_size, loss, lr,
               AchievedCompression(TrainingFloatsPushed(*client_)));
  }
  return loss;
}

EvalSums Trainer::EvaluateTest() {
  const EvalSums sums = Evaluate(x_);
  if (metrics_ != nullptr) metrics_->SetTestAccuracy(/*global=*/false, Accuracy(sums));
  return sums;
}

double Trainer::AchievedCompression(uint64_t floats_pushed) const {
  return floats_pushed == 0 ? 0.0
                            : static_cast<double>(step_) * plan_.shard_floats / floats_pushed;
}


void ReportTraffic(const PsClient& client, WorkerMetrics* metrics) {
  const std::pair<const char*, PsClient::StreamTraffic> streams[] = {
      {"GRAD", client.traffic(v1::GRAD)},
      {"MODEL", client.traffic(v1::MODEL)},
      {"sparse", client.sparse_traffic()},
      {"async", client.async_traffic()}};
  uint64_t pushed = 0, pulled = 0;
  for (const auto& [name, traffic] : streams) {
    metrics->SetTraffic(name, traffic.bytes_pushed, traffic.bytes_pulled);
    pushed += traffic.bytes_pushed;
    pulled += traffic.bytes_pulled;
  }
  // Model pushes and pulls count only towards the totals.
  metrics->SetTraffic("other", client.bytes_pushed() > pushed ? client.bytes_pushed() - pushed : 0,
                      client.bytes_pulled() > pulled ? client.bytes_pulled() - pulled : 0);
}

EvalSums Trainer::Evaluate(absl::Span<const float> params) {
  EvalSums total;
  SequentialBatches batches(*test_, 1000);
  for (size_t i = 0; i < batches.count(); ++i) {
    const EvalSums part = model_->Evaluate(params, batches.Get(i));
    total.loss_sum += part.loss_sum;
    total.correct += part.correct;
    total.count += part.count;
  }
  return total;
}

absl::Status Trainer::Run() {
  RETURN_IF_ERROR(InitializeModel());
  const absl::Time start = absl::Now();
  const EpochLoop loop{&config_,           client_,          &schedule_,
                       plan_.steps_per_epoch, plan_.batch_size, plan_.log_prefix};
  RETURN_IF_ERROR(RunEpochs(
      loop, start, [this] { return Step(); },
      [this]() -> absl::StatusOr<EvalSums> { return EvaluateTest(); }, &curve_));
  RETURN_IF_ERROR(FinishTraining());
  LogFinal(plan_.log_prefix, final_);
  return WriteOutputs(absl::ToDoubleSeconds(absl::Now() - start));
}

absl::Status Trainer::FinishTraining() {
  // Traffic of the training steps alone, against S-SGD's d floats per step.
  const uint64_t floats = TrainingFloatsPushed(*client_);
  final_.training_floats_pushed = floats;
  final_.achieved_compression = AchievedCompression(floats);
  final_.local_accuracy = Accuracy(EvaluateTest());
  RETURN_IF_ERROR(algorithm_->Finish(step_, absl::MakeSpan(x_)));
  std::vector<float> global(x_.size());
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(global), /*wait_for_init=*/false));
  final_.global_accuracy = Accuracy(Evaluate(global));
  if (metrics_ != nullptr) {
    metrics_->SetTestAccuracy(/*global=*/true, final_.global_accuracy);
    ReportTraffic(*client_, metrics_);
  }
  return absl::OkStatus();
}

std::string Trainer::SummaryBaseName() const {
  return cserps::SummaryBaseName(config_, plan_.rank, plan_.local_rank);
}

absl::Status Trainer::WriteOutputs(double wall_seconds) const {
  TrainingSummary summary;
  summary.config = &config_;
  summary.client = client_;
  summary.rank = plan_.rank;
  summary.local_rank = plan_.local_rank;
  summary.num_params = x_.size();
  summary.steps = step_;
  summary.batch_size = plan_.batch_size;
  summary.curve = &curve_;
  summary.final_report = &final_;
  summary.wall_seconds = wall_seconds;
  return WriteTrainingSummary(summary);
}

absl::Status WriteTrainingSummary(const TrainingSummary& summary) {
  const v1::JobConfig& config = *summary.config;
  const PsClient& client = *summary.client;
  const FinalReport& final_report = *summary.final_report;
  const double wall_seconds = summary.wall_seconds;
  const std::filesystem::path dir(config.output_dir());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(absl::StrCat(
        "output_dir: cannot create ", dir.string(), ": ", error.message()));
  }
  const std::string base = SummaryBaseName(config, summary.rank, summary.local_rank);
  {
    std::ofstream csv(dir / (base + ".csv"));
    csv << "epoch,step,train_loss,test_loss,test_accuracy,wall_seconds,bytes_pushed,bytes_pulled\n";
    for (const CurvePoint& p : *summary.curve) {
      csv << absl::StrFormat("%d,%d,%.6f,%.6f,%.6f,%.3f,%d,%d\n", p.epoch, p.step,
                             p.train_loss, p.test_loss, p.test_accuracy,
                             p.wall_seconds, p.bytes_pushed, p.bytes_pulled);
    }
    if (!csv) return absl::DataLossError(absl::StrCat("cannot write ", (dir / (base + ".csv")).string()));
  }
  const CurvePoint last = summary.curve->empty() ? CurvePoint() : summary.curve->back();
  std::ofstream json(dir / (base + ".json"));
  const PsClient::StreamTraffic grad = client.traffic(v1::GRAD);
  const PsClient::StreamTraffic model = client.traffic(v1::MODEL);
  json << absl::StrFormat(
      "{\n  \"job\": \"%s\",\n  \"rank\": %d,\n  \"local_rank\": %d,\n"
      "  \"local_size\": %d,\n  \"algorithm\": \"%s\",\n"
      "  \"num_params\": %d,\n  \"epochs\": %d,\n  \"steps\": %d,\n"
      "  \"batch_size\": %d,\n  \"train_loss\": %.6f,\n  \"test_loss\": %.6f,\n"
      "  \"test_accuracy\": %.6f,\n  \"wall_seconds\": %.3f,\n"
      "  \"samples_per_second\": %.1f,\n  \"bytes_pushed\": %d,\n"
      "  \"bytes_pulled\": %d,\n"
      "  \"grad_bytes_pushed\": %d,\n  \"grad_bytes_pulled\": %d,\n"
      "  \"model_bytes_pushed\": %d,\n  \"model_bytes_pulled\": %d,\n"
      "  \"training_floats_pushed\": %d,\n  \"overall_ratio\": %.6g,\n"
      "  \"achieved_compression\": %.6g,\n"
      "  \"test_accuracy_local\": %.6f,\n  \"test_accuracy_global\": %.6f\n}\n",
      config.name(), summary.rank, summary.local_rank, config.cluster().local_size(),
      config.algorithm().name(), summary.num_params,
      config.epochs(), summary.steps, summary.batch_size, last.train_loss, last.test_loss,
      last.test_accuracy, wall_seconds,
      wall_seconds > 0 ? summary.steps * summary.batch_size / wall_seconds : 0.0,
      client.bytes_pushed(), client.bytes_pulled(), grad.bytes_pushed,
      grad.bytes_pulled, model.bytes_pushed, model.bytes_pulled,
      final_report.training_floats_pushed, OverallRatio(config.algorithm()),
      final_report.achieved_compression, final_report.local_accuracy,
      final_report.global_accuracy);
  if (!json) return absl::DataLossError(absl::StrCat("cannot write ", (dir / (base + ".json")).string()));
  return absl::OkStatus();
}

}  // namespace cserps
