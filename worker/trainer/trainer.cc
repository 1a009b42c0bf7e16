#include "worker/trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/algorithm_catalog.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/algorithms/registry.h"
#include "worker/device/host_backend.h"
#include "worker/trainer/state_checkpoint.h"
#include "worker/trainer/rejoin.h"
#include "worker/trainer/roll_back.h"

namespace cserps {
namespace {

// The models check their input only as a programmer's error (an abort), so
// data that does not fit the job's model is refused here, by name.
absl::Status CheckModelFits(const ModelSpec& spec, const Dataset& data, const char* split) {
  if (data.dim != spec.input_dim) {
    return absl::InvalidArgumentError(absl::StrCat("model.input_dim is ", spec.input_dim,
                                                   " but the ", split, " data has ", data.dim,
                                                   " features per example"));
  }
  const auto largest = std::max_element(data.labels.begin(), data.labels.end());
  if (largest != data.labels.end() && *largest >= spec.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_classes is ", spec.num_classes, " but the ", split, " data has label ",
        static_cast<int>(*largest), " (example ", largest - data.labels.begin(), ")"));
  }
  return absl::OkStatus();
}

constexpr size_t kEvalBatch = 1000;
// How long beyond a round's timeout a rejoining worker waits for a job
// whose steps do not move.
constexpr absl::Duration kRejoinPatience = absl::Seconds(60);
// Roll backs to a restarted shard's checkpoint one run follows at most, and
// how long it waits for a shard that does not answer to come back.
constexpr int kMaxRollBacks = 10;
constexpr absl::Duration kRestartPatience = absl::Seconds(120);

double SumOf(const std::vector<float>& losses) {
  double sum = 0;
  for (float loss : losses) sum += loss;
  return sum;
}

// The learning-curve row of the epoch that just ended (epoch is 1-based),
// logged as the epoch's progress line.
// A test evaluation after `steps` of the steps_per_epoch steps of epoch
// `epoch` (1-based), of which this process trained those of `losses` (all,
// unless it rejoined the job in this epoch).
CurvePoint Evaluation(uint64_t epoch, uint64_t step, const std::vector<float>& losses, size_t steps,
                      size_t steps_per_epoch, const EvalSums& test, double wall_seconds,
                      const PsClient& client, const std::string& log_prefix) {
  CurvePoint point;
  point.epoch = epoch;
  point.step = step;
  point.epochs = static_cast<double>(step) / steps_per_epoch;
  point.train_loss = SumOf(losses) / std::max<size_t>(1, losses.size());
  point.test_loss = test.loss_sum / std::max<size_t>(1, test.count);
  point.test_accuracy = Accuracy(test);
  point.wall_seconds = wall_seconds;
  point.bytes_pushed = client.bytes_pushed();
  point.bytes_pulled = client.bytes_pulled();
  spdlog::info("{}epoch {}{}: train loss {:.4f} test loss {:.4f} test accuracy {:.2f}% ({:.1f} s)",
               log_prefix, point.epoch,
               steps == steps_per_epoch ? std::string(" done")
                                        : absl::StrFormat(" at %d/%d steps", steps,
                                                          steps_per_epoch),
               point.train_loss, point.test_loss, 100 * point.test_accuracy,
               point.wall_seconds);
  return point;
}

void LogStep(const std::string& log_prefix, uint64_t step, uint64_t epoch, float loss,
             float lr, double samples_per_second, const PsClient& client) {
  spdlog::info("{}step {} epoch {} loss {:.4f} lr {:.4g} samples/s {:.0f} pushed {:.1f} MB pulled {:.1f} MB",
               log_prefix, step, epoch, loss, lr, samples_per_second,
               client.bytes_pushed() / 1e6, client.bytes_pulled() / 1e6);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobConfig& config, PsClient* client, const Dataset* train,
    const Dataset* test, WorkerMetrics* metrics) {
  return Create(config, TrainerLink{client, nullptr}, train, test, metrics);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const v1::JobConfig& config, TrainerLink link, const Dataset* train,
    const Dataset* test, WorkerMetrics* metrics, std::unique_ptr<DeviceBackend> backend) {
  ASSIGN_OR_RETURN(TrainerPlan plan, PlanTrainer(config, link, train->size));
  RETURN_IF_ERROR(PrepareOutputDir(config));
  if (backend == nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeCpuModel(config.model()));
    backend = std::make_unique<HostBackend>(std::move(model),
                                            config.algorithm().block_size());
  }
  RETURN_IF_ERROR(CheckModelFits(backend->spec(), *train, "training"));
  RETURN_IF_ERROR(CheckModelFits(backend->spec(), *test, "test"));
  if (backend->spec().num_params != link.client->layout().num_params() ||
      backend->ops().num_params() != backend->spec().num_params) {
    return absl::InternalError("model, device and client disagree on the model size");
  }
  std::unique_ptr<Trainer> trainer(
      new Trainer(config, link, std::move(plan), train, test, std::move(backend)));
  trainer->metrics_ = metrics;
  absl::Status init;
  try {
    init = trainer->Init();
  } catch (const std::bad_alloc&) {
    // Refused by name, as a shard too large for its machine is, rather than
    // aborted by the allocation.
    init = absl::ResourceExhaustedError(absl::StrCat(
        "the worker's buffers for a model of ", trainer->num_params_,
        " parameters and its activations at batch size ", trainer->plan_.batch_size,
        " do not fit in this machine's memory"));
  }
  RETURN_IF_ERROR(SharedStatus(trainer->link_, init, "trainer set-up"));
  return trainer;
}

Trainer::Trainer(const v1::JobConfig& config, TrainerLink link, TrainerPlan plan,
                 const Dataset* train, const Dataset* test,
                 std::unique_ptr<DeviceBackend> backend)
    : config_(config),
      link_(link),
      plan_(std::move(plan)),
      client_(link.client),
      test_(test),
      num_params_(backend->spec().num_params),
      backend_(std::move(backend)),
      ops_(backend_->ops()),
      batcher_(*train, plan_.range, plan_.batch_size, config.seed(), plan_.partition),
      schedule_(config.optimizer(), plan_.steps_per_epoch, config.epochs()),
      slowdown_(config.data().rank_slowdown_size() > 0
                    ? config.data().rank_slowdown(plan_.partition)
                    : 1.0f) {}

absl::Status Trainer::Init() {
  members_ = config_.cluster().num_workers();
  RETURN_IF_ERROR(backend_->Reserve(std::max<size_t>(plan_.batch_size, kEvalBatch)));
  ASSIGN_OR_RETURN(x_, ops_.Allocate());
  ASSIGN_OR_RETURN(grad_, ops_.Allocate());
  AlgorithmContext context;
  context.config = &config_;
  context.comm = client_;
  context.ops = &ops_;
  context.group = link_.group;
  context.weight = static_cast<float>(plan_.batch_size);
  context.steps_per_epoch = plan_.steps_per_epoch;
  ASSIGN_OR_RETURN(algorithm_, MakeAlgorithm(context));
  return absl::OkStatus();
}

absl::Status Trainer::InitializeModel() {
  if (config_.cluster().admit_every_steps() > 0) {
    ASSIGN_OR_RETURN(const bool under_way, JobUnderWay(*client_));
    if (under_way) return RejoinRunningJob();
  }
  if (ResumesFromCheckpoint(config_, *client_)) return ResumeFromCheckpoint();
  RETURN_IF_ERROR(SharedStatus(link_, StartWithoutCheckpoint(config_, *client_, plan_.partition),
                               "fresh start"));
  std::vector<float> x(num_params_);
  if (plan_.rank == 0) {
    // Only local rank 0's model is pushed; every local rank joins the push.
    if (plan_.local_rank == 0) backend_->Initialize(config_.seed(), absl::MakeSpan(x));
    RETURN_IF_ERROR(PushModel(link_, x));
  }
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(x), /*wait_for_init=*/true));
  return ops_.Upload(x, x_.data());
}

absl::Status Trainer::ResumeFromCheckpoint() {
  auto load = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const RankCheckpoint loaded,
                     ResumeState(config_, *client_, plan_.partition, plan_.steps_per_epoch,
                                 *algorithm_, ops_, plan_.log_prefix));
    epoch_losses_ = loaded.epoch_losses;
    step_ = first_step_ = resumed_from_ = loaded.step;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(SharedStatus(link_, load(), "checkpoint resume"));
  std::vector<float> x(num_params_);
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(x), /*wait_for_init=*/false));
  return ops_.Upload(x, x_.data());
}

absl::Status Trainer::RejoinRunningJob() {
  const uint64_t total = uint64_t{config_.epochs()} * plan_.steps_per_epoch;
  ASSIGN_OR_RETURN(const uint64_t step, AwaitAdmission(*client_, config_, total,
                                                       kRejoinPatience, plan_.log_prefix));
  std::vector<float> x(num_params_);
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(x), /*wait_for_init=*/false));
  RETURN_IF_ERROR(ops_.Upload(x, x_.data()));
  const std::vector<float> zeros(num_params_, 0.0f);
  for (float* buffer : algorithm_->StateBuffers()) RETURN_IF_ERROR(ops_.Upload(zeros, buffer));
  RETURN_IF_ERROR(algorithm_->ResumeAfter(step));
  RETURN_IF_ERROR(algorithm_->AdoptGlobalModel(x_.data()));
  step_ = first_step_ = joined_at_ = step;
  spdlog::info("{}rejoined the job at step {} with the servers' model and zero state",
               plan_.log_prefix, step_);
  // The admission's full average may be a checkpoint's, which the others
  // took without this rank: its part is what it starts from (the average
  // and zero state), and without it the step never completed.
  if (!CheckpointDue(config_, step_, total)) return absl::OkStatus();
  training_floats_at_[step_] = TrainingFloats();
  return WriteStateCheckpoint(config_, plan_.partition, step_, *algorithm_, ops_, {},
                              plan_.log_prefix);
}

absl::Status Trainer::FullAverageIfDue() {
  const uint32_t admit = config_.cluster().admit_every_steps();
  const uint64_t total = uint64_t{config_.epochs()} * plan_.steps_per_epoch;
  const bool checkpoint = CheckpointDue(config_, step_, total);
  if (!checkpoint && !(admit != 0 && step_ % admit == 0 && step_ < total)) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(algorithm_->SettleForCheckpoint(x_.data()));
  RETURN_IF_ERROR(algorithm_->AverageForCheckpoint(step_, x_.data()));
  if (!checkpoint) return absl::OkStatus();
  training_floats_at_[step_] = TrainingFloats();
  // A finished epoch's losses have been reported; the next one starts empty.
  return WriteStateCheckpoint(
      config_, plan_.partition, step_, *algorithm_, ops_,
      step_ % plan_.steps_per_epoch == 0 ? absl::Span<const float>() : epoch_losses_,
      plan_.log_prefix);
}

absl::Status Trainer::EndCompute(absl::Time compute_start, const absl::StatusOr<float>& loss) {
  absl::Status status = loss.status();
  if (status.ok() && slowdown_ > 1.0f) {
    absl::SleepFor((slowdown_ - 1.0f) * (absl::Now() - compute_start));
  }
  if (status.ok() && !std::isfinite(*loss)) {
    status = absl::InternalError(absl::StrCat("rank ", plan_.rank, " step ", step_,
                                              ": training loss is ", *loss,
                                              " (diverged: lower optimizer.lr?)"));
  }
  return SharedStatus(link_, status, absl::StrCat("step ", step_));
}

absl::StatusOr<float> Trainer::Step() {
  const uint64_t index = step_ % plan_.steps_per_epoch;
  if (index == 0 || !epoch_started_) {
    batcher_.StartEpoch(step_ / plan_.steps_per_epoch);
    epoch_started_ = true;
  }
  if (index == 0) epoch_losses_.clear();
  const Batch batch = batcher_.Get(index);
  const absl::Time compute_start = absl::Now();
  // Waiting for the loss costs little: the gather waits for the gradient
  // anyway, and a diverged loss stops the step before it is pushed.
  const absl::StatusOr<float> computed =
      backend_->LossAndGradient(x_.data(), batch, grad_.data());
  RETURN_IF_ERROR(EndCompute(compute_start, computed));
  const float loss = *computed;
  const absl::Time algorithm_start = absl::Now();
  const absl::Duration waited_before = client_->wait_time();
  const float lr = schedule_.At(step_);
  RETURN_IF_ERROR(algorithm_->Step(step_, lr, grad_.data(), x_.data()));
  ++step_;
  epoch_losses_.push_back(loss);
  if (const uint32_t members = client_->members(); members != members_) {
    spdlog::warn("{}step {}: the servers' rounds now wait for {} of {} members (elastic: {})",
                 plan_.log_prefix, step_, members, config_.cluster().num_workers(),
                 members < members_ ? "the others missed a round's timeout"
                                    : "a rank was admitted back");
    membership_.push_back({step_, members});
    members_ = members;
  }
  if (metrics_ != nullptr) {
    // Compute until the algorithm starts; communication, the time blocked
    // on the servers since then; update, the rest.
    const absl::Duration algorithm = absl::Now() - algorithm_start;
    const absl::Duration communication =
        std::min(algorithm, client_->wait_time() - waited_before);
    metrics_->RecordStep(algorithm_start - compute_start, communication,
                         algorithm - communication, plan_.batch_size, loss, lr);
    ReportTraffic(*client_, *metrics_);
    metrics_->SetCompressionRatio(AchievedCompression());
    metrics_->SetMembers(members_);
  }
  return loss;
}

uint64_t Trainer::TrainingFloats() const {
  return TrainingFloatsPushed(*client_) - floats_trained_again_;
}

double Trainer::AchievedCompression() const {
  const uint64_t floats = TrainingFloats();
  // The steps of this process: its client counts only what it pushed.
  return floats == 0 ? 0.0
                     : static_cast<double>(step_ - first_step_) * plan_.shard_floats / floats;
}

absl::StatusOr<EvalSums> Trainer::Evaluate(const float* params) {
  EvalSums total;
  SequentialBatches batches(*test_, kEvalBatch);
  for (size_t i = 0; i < batches.count(); ++i) {
    ASSIGN_OR_RETURN(const EvalSums part, backend_->Evaluate(params, batches.Get(i)));
    total.Add(part);
  }
  return total;
}

absl::StatusOr<EvalSums> Trainer::EvaluateTest() {
  const absl::StatusOr<EvalSums> evaluated = Evaluate(x_.data());
  RETURN_IF_ERROR(SharedStatus(link_, evaluated.status(), "test evaluation"));
  const EvalSums sums = *evaluated;
  if (metrics_ != nullptr) metrics_->SetTestAccuracy(/*global=*/false, Accuracy(sums));
  return sums;
}

absl::StatusOr<std::vector<float>> Trainer::Params() {
  std::vector<float> x(num_params_);
  RETURN_IF_ERROR(ops_.Download(x_.data(), absl::MakeSpan(x)));
  return x;
}

absl::Status Trainer::FinishTraining() {
  // Traffic of the training steps alone, against S-SGD's d floats per step.
  final_.training_floats_pushed = TrainingFloats();
  final_.achieved_compression = AchievedCompression();
  ASSIGN_OR_RETURN(const EvalSums local, EvaluateTest());
  final_.local_accuracy = Accuracy(local);
  RETURN_IF_ERROR(algorithm_->Finish(step_, x_.data()));
  std::vector<float> global(num_params_);
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(global), /*wait_for_init=*/false));
  // Training is over: the gradient buffer holds the servers' model.
  RETURN_IF_ERROR(ops_.Upload(global, grad_.data()));
  ASSIGN_OR_RETURN(const EvalSums servers, Evaluate(grad_.data()));
  final_.global_accuracy = Accuracy(servers);
  if (metrics_ != nullptr) {
    ReportTraffic(*client_, *metrics_);
    metrics_->SetTestAccuracy(/*global=*/true, final_.global_accuracy);
  }
  return absl::OkStatus();
}

absl::Status Trainer::RunEpochs(absl::Time start) {
  const uint32_t log_every = config_.log_every_steps();
  absl::Time window_start = start;
  uint64_t window_steps = 0;
  const size_t spe = plan_.steps_per_epoch;
  const size_t evals = std::min<size_t>(config_.evals_per_epoch(), spe);
  for (uint64_t epoch = step_ / spe; epoch < config_.epochs(); ++epoch) {
    // Evaluation k follows step k * spe / evals of the epoch; a resumed
    // epoch skips those already done.
    size_t next_eval = 1;
    while (next_eval * spe / evals <= step_ % spe) ++next_eval;
    for (size_t i = step_ % spe; i < spe; ++i) {
      ASSIGN_OR_RETURN(const float loss, Step());
      ++window_steps;
      if (i + 1 == next_eval * spe / evals) {
        ++next_eval;
        ASSIGN_OR_RETURN(const EvalSums test, EvaluateTest());
        curve_.push_back(Evaluation(epoch + 1, step_, epoch_losses_, i + 1, spe, test,
                                    absl::ToDoubleSeconds(absl::Now() - start), *client_,
                                    plan_.log_prefix));
      }
      if (log_every != 0 && step_ % log_every == 0) {
        const absl::Time now = absl::Now();
        const double seconds = absl::ToDoubleSeconds(now - window_start);
        LogStep(plan_.log_prefix, step_, epoch, loss, schedule_.At(step_ - 1),
                seconds > 0 ? window_steps * plan_.batch_size / seconds : 0.0, *client_);
        window_start = now;
        window_steps = 0;
      }
      RETURN_IF_ERROR(FullAverageIfDue());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Trainer::RollBackIfAShardRestarted(const absl::Status& failure) {
  const absl::StatusOr<AlgorithmInfo> algorithm = FindAlgorithm(config_.algorithm().name());
  if (link_.group != nullptr || config_.checkpoint().every_steps() == 0 ||
      config_.checkpoint().dir().empty() || !algorithm.ok() ||
      !algorithm->rolls_back_in_place()) {
    return false;
  }
  // What a shard that went away, came back empty or rolled back answers.
  if (!absl::IsUnavailable(failure) && !absl::IsCancelled(failure) &&
      !absl::IsFailedPrecondition(failure) && !absl::IsAborted(failure) &&
      !absl::IsDeadlineExceeded(failure)) {
    return false;
  }
  ASSIGN_OR_RETURN(const std::optional<RestartedShard> restarted,
                   FindRestartedShard(*client_, followed_restart_, kRestartPatience));
  if (!restarted.has_value()) return false;
  spdlog::warn("{}step {} failed ({}): shard {} {} the checkpoint of step {}; rolling back to "
               "it in place",
               plan_.log_prefix, step_, std::string(failure.message()), restarted->shard,
               restarted->restarted ? "restarted from" : "rolled back to", restarted->step);
  RETURN_IF_ERROR(RollBackShards(*client_, *restarted));
  // After the roll back, which answers the rounds they wait for, and before
  // registering again, which replaces the bulk channels they use.
  algorithm_->AbandonInFlight();
  RETURN_IF_ERROR(client_->Reregister());
  followed_restart_ = restarted->incarnation;
  // This process still started where it did, unless the checkpoint is
  // older still (a rank that rejoined, rolled back to one its predecessor
  // wrote): then it starts again from there, as a resume would, and is no
  // longer one that joined.
  const uint64_t first_step = first_step_, resumed_from = resumed_from_;
  RETURN_IF_ERROR(ResumeFromCheckpoint());
  if (step_ >= first_step) {
    first_step_ = first_step;
    resumed_from_ = resumed_from;
  } else {
    joined_at_ = 0;
  }
  // The steps after the checkpoint are trained again, and count once. A
  // checkpoint it did not write is where it started (or starts again),
  // having trained nothing yet.
  const auto at = training_floats_at_.find(step_);
  floats_trained_again_ = TrainingFloatsPushed(*client_) -
                          (at != training_floats_at_.end() ? at->second : 0);
  training_floats_at_.erase(training_floats_at_.upper_bound(step_), training_floats_at_.end());
  while (!curve_.empty() && curve_.back().step > step_) curve_.pop_back();
  while (!membership_.empty() && membership_.back().step > step_) membership_.pop_back();
  // A change undone with its steps is seen again at the next step if the
  // rounds still wait for as many members.
  members_ = membership_.empty() ? config_.cluster().num_workers() : membership_.back().members;
  epoch_started_ = false;
  ++roll_backs_;
  return true;
}

absl::Status Trainer::Run() {
  RETURN_IF_ERROR(InitializeModel());
  const absl::Time start = absl::Now();
  for (int roll_backs = 0;; ++roll_backs) {
    const absl::Status trained = RunEpochs(start);
    if (trained.ok()) break;
    if (roll_backs == kMaxRollBacks) return trained;
    ASSIGN_OR_RETURN(const bool rolled_back, RollBackIfAShardRestarted(trained));
    if (!rolled_back) return trained;
  }
  RETURN_IF_ERROR(FinishTraining());
  spdlog::info("{}final: local model {:.2f}%, global model {:.2f}%, achieved compression {:.1f}x",
               plan_.log_prefix, 100 * final_.local_accuracy, 100 * final_.global_accuracy,
               final_.achieved_compression);
  TrainingSummary summary;
  summary.config = &config_;
  summary.client = client_;
  summary.rank = plan_.rank;
  summary.local_rank = plan_.local_rank;
  summary.num_params = num_params_;
  summary.steps = step_;
  summary.resumed_from_step = resumed_from_;
  summary.joined_at_step = joined_at_;
  summary.roll_backs = roll_backs_;
  summary.membership = &membership_;
  summary.batch_size = plan_.batch_size;
  summary.curve = &curve_;
  summary.final_report = &final_;
  summary.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return WriteTrainingSummary(summary);
}

}  // namespace cserps
