#include "worker/device/device_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "worker/data/partition.h"

namespace cserps {
namespace {

constexpr size_t kEvalBatch = 1000;  // as the host Trainer's

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(
    const v1::JobConfig& config, TrainerLink link, const Dataset* train,
    const Dataset* test, std::unique_ptr<DeviceBackend> backend, WorkerMetrics* metrics) {
  ASSIGN_OR_RETURN(TrainerPlan plan, PlanTrainer(config, link, train->size));
  if (backend->spec().input_dim != train->dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.input_dim is ", backend->spec().input_dim, " but the data has ", train->dim,
        " features per example"));
  }
  if (backend->spec().num_params != link.client->layout().num_params() ||
      backend->ops().num_params() != backend->spec().num_params) {
    return absl::InternalError("model, device and client disagree on the model size");
  }
  std::unique_ptr<DeviceTrainer> trainer(
      new DeviceTrainer(config, link, std::move(plan), train, test, std::move(backend)));
  trainer->metrics_ = metrics;
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

DeviceTrainer::DeviceTrainer(const v1::JobConfig& config, TrainerLink link,
                             TrainerPlan plan, const Dataset* train, const Dataset* test,
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

absl::Status DeviceTrainer::Init() {
  RETURN_IF_ERROR(backend_->Reserve(std::max<size_t>(plan_.batch_size, kEvalBatch)));
  ASSIGN_OR_RETURN(x_, ops_.Allocate());
  ASSIGN_OR_RETURN(grad_, ops_.Allocate());
  DeviceAlgorithmContext context;
  context.config = &config_;
  context.client = client_;
  context.ops = &ops_;
  context.group = link_.group;
  context.weight = static_cast<float>(plan_.batch_size);
  ASSIGN_OR_RETURN(algorithm_, MakeDeviceAlgorithm(context));
  return absl::OkStatus();
}

absl::Status DeviceTrainer::InitializeModel() {
  std::vector<float> x(num_params_);
  if (plan_.rank == 0) {
    // Only local rank 0's model is pushed; every local rank joins the push.
    if (plan_.local_rank == 0) backend_->Initialize(config_.seed(), absl::MakeSpan(x));
    RETURN_IF_ERROR(PushModel(link_, x));
  }
  RETURN_IF_ERROR(PullModel(link_, absl::MakeSpan(x), /*wait_for_init=*/true));
  return ops_.Upload(x, x_.data());
}

absl::StatusOr<float> DeviceTrainer::Step() {
  const uint64_t index = step_ % plan_.steps_per_epoch;
  if (index == 0) batcher_.StartEpoch(step_ / plan_.steps_per_epoch);
  const Batch batch = batcher_.Get(index);
  StepTiming timing;
  timing.compute_start = absl::Now();
  // Waiting for the loss costs little: the gather waits for the gradient
  // anyway, and a diverged loss stops the step before it is pushed, as on
  // the host.
  ASSIGN_OR_RETURN(const float loss,
                   backend_->LossAndGradient(x_.data(), batch, grad_.data()));
  RETURN_IF_ERROR(EndCompute(slowdown_, timing.compute_start, loss, link_, step_));
  timing.algorithm_start = absl::Now();
  timing.waited_before = client_->wait_time();
  const float lr = schedule_.At(step_);
  RETURN_IF_ERROR(algorithm_->Step(step_, lr, grad_.data(), x_.data()));
  ++step_;
  if (metrics_ != nullptr) {
    RecordStep(*metrics_, *client_, timing, plan_.batch_size, loss, lr, AchievedCompression());
  }
  return loss;
}

double DeviceTrainer::AchievedCompression() const {
  const uint64_t floats = TrainingFloatsPushed(*client_);
  return floats == 0 ? 0.0 : static_cast<double>(step_) * plan_.shard_floats / floats;
}

absl::StatusOr<EvalSums> DeviceTrainer::Evaluate(const float* params) {
  EvalSums total;
  SequentialBatches batches(*test_, kEvalBatch);
  for (size_t i = 0; i < batches.count(); ++i) {
    ASSIGN_OR_RETURN(const EvalSums part, backend_->Evaluate(params, batches.Get(i)));
    total.loss_sum += part.loss_sum;
    total.correct += part.correct;
    total.count += part.count;
  }
  return total;
}

absl::StatusOr<EvalSums> DeviceTrainer::EvaluateTest() {
  ASSIGN_OR_RETURN(const EvalSums sums, Evaluate(x_.data()));
  if (metrics_ != nullptr) metrics_->SetTestAccuracy(/*global=*/false, Accuracy(sums));
  return sums;
}

absl::StatusOr<std::vector<float>> DeviceTrainer::Params() {
  std::vector<float> x(num_params_);
  RETURN_IF_ERROR(ops_.Download(x_.data(), absl::MakeSpan(x)));
  return x;
}

absl::Status DeviceTrainer::FinishTraining() {
  final_.training_floats_pushed = TrainingFloatsPushed(*client_);
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
    ReportTraffic(*client_, metrics_);
    metrics_->SetTestAccuracy(/*global=*/true, final_.global_accuracy);
  }
  return absl::OkStatus();
}

absl::Status DeviceTrainer::Run() {
  RETURN_IF_ERROR(InitializeModel());
  const absl::Time start = absl::Now();
  const EpochLoop loop{&config_,           client_,          &schedule_,
                       plan_.steps_per_epoch, plan_.batch_size, plan_.log_prefix};
  RETURN_IF_ERROR(RunEpochs(
      loop, start, [this] { return Step(); }, [this] { return EvaluateTest(); }, &curve_));
  RETURN_IF_ERROR(FinishTraining());
  LogFinal(plan_.log_prefix, final_);
  TrainingSummary summary;
  summary.config = &config_;
  summary.client = client_;
  summary.rank = plan_.rank;
  summary.local_rank = plan_.local_rank;
  summary.num_params = num_params_;
  summary.steps = step_;
  summary.batch_size = plan_.batch_size;
  summary.curve = &curve_;
  summary.final_report = &final_;
  summary.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return WriteTrainingSummary(summary);
}

}  // namespace cserps
