#include "worker/cuda/device_trainer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/data/partition.h"

namespace cserps {
namespace {

constexpr size_t kEvalBatch = 1000;  // as the host Trainer's

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(
    const v1::JobConfig& config, PsClient* client, const Dataset* train,
    const Dataset* test, std::unique_ptr<CudaModel> model, WorkerMetrics* metrics) {
  if (config.cluster().local_size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", config.cluster().local_size(),
        ": the device trainer runs flat workers only"));
  }
  if (!HasDeviceAlgorithm(config.algorithm())) {
    return absl::UnimplementedError(absl::StrCat(
        "algorithm ", config.algorithm().name(),
        " has no device implementation (device algorithms: ssgd, cser and m-cser "
        "with cser_variant MODEL_BLOCKS)"));
  }
  const uint32_t rank = client->rank();
  const std::vector<uint32_t> batch_sizes = RankBatchSizes(config);
  if (rank >= batch_sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " has no batch size: the job has ", batch_sizes.size(),
        " workers"));
  }
  const size_t steps_per_epoch = StepsPerEpoch(train->size, batch_sizes);
  if (steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: ", train->size, " training examples are too few for ",
        batch_sizes.size(), " workers: not one step per epoch"));
  }
  if (model->spec().input_dim != train->dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.input_dim is ", model->spec().input_dim, " but the data has ",
        train->dim, " features per example"));
  }
  if (model->spec().num_params != client->layout().num_params()) {
    return absl::InternalError("model and client disagree on the model size");
  }
  std::unique_ptr<DeviceTrainer> trainer(new DeviceTrainer(
      config, client, train, test, steps_per_epoch,
      RankRange(train->size, batch_sizes, rank), batch_sizes[rank], std::move(model)));
  trainer->metrics_ = metrics;
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

DeviceTrainer::DeviceTrainer(const v1::JobConfig& config, PsClient* client,
                             const Dataset* train, const Dataset* test,
                             size_t steps_per_epoch, Range range, uint32_t batch_size,
                             std::unique_ptr<CudaModel> model)
    : config_(config),
      client_(client),
      test_(test),
      rank_(client->rank()),
      steps_per_epoch_(steps_per_epoch),
      batch_size_(batch_size),
      num_params_(model->spec().num_params),
      model_(std::move(model)),
      batcher_(*train, range, batch_size, config.seed(), rank_),
      schedule_(config.optimizer(), steps_per_epoch, config.epochs()),
      slowdown_(config.data().rank_slowdown_size() > 0 ? config.data().rank_slowdown(rank_)
                                                       : 1.0f) {}

DeviceTrainer::~DeviceTrainer() {
  if (stream_ == nullptr) return;
  static_cast<void>(cudaStreamSynchronize(stream_));
  algorithm_.reset();
  staging_.reset();
  static_cast<void>(cudaStreamDestroy(stream_));
}

absl::Status DeviceTrainer::Init() {
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  max_rows_ = std::max<size_t>(batch_size_, kEvalBatch);
  const size_t dim = model_->spec().input_dim;
  RETURN_IF_ERROR(model_->Reserve(max_rows_));
  ASSIGN_OR_RETURN(host_features_, PinnedBuffer<float>::Allocate(max_rows_ * dim));
  ASSIGN_OR_RETURN(host_labels_, PinnedBuffer<uint8_t>::Allocate(max_rows_));
  ASSIGN_OR_RETURN(features_, DeviceBuffer<float>::Allocate(max_rows_ * dim));
  ASSIGN_OR_RETURN(labels_, DeviceBuffer<uint8_t>::Allocate(max_rows_));
  ASSIGN_OR_RETURN(x_, DeviceBuffer<float>::Allocate(num_params_));
  ASSIGN_OR_RETURN(grad_, DeviceBuffer<float>::Allocate(num_params_));
  ASSIGN_OR_RETURN(loss_, DeviceBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(loss_sum_, DeviceBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(correct_, DeviceBuffer<unsigned long long>::Allocate(1));
  ASSIGN_OR_RETURN(host_loss_, PinnedBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(host_loss_sum_, PinnedBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(host_correct_, PinnedBuffer<unsigned long long>::Allocate(1));
  ASSIGN_OR_RETURN(staging_, CudaStagingDevice::Create(
                                 num_params_, config_.algorithm().block_size(), stream_));
  DeviceAlgorithmContext context;
  context.config = &config_;
  context.client = client_;
  context.staging = staging_.get();
  context.stream = stream_;
  context.weight = static_cast<float>(batch_size_);
  ASSIGN_OR_RETURN(algorithm_, MakeDeviceAlgorithm(context));
  return absl::OkStatus();
}

absl::Status DeviceTrainer::Upload(const Batch& batch) {
  if (batch.size > max_rows_) {
    return absl::InternalError(absl::StrCat("batch of ", batch.size,
                                            " rows exceeds the staging of ", max_rows_));
  }
  // The previous upload from the pinned buffers has run: every step and
  // every evaluation batch ends with a stream synchronisation.
  std::memcpy(host_features_.data(), batch.features.data(),
              batch.features.size() * sizeof(float));
  std::memcpy(host_labels_.data(), batch.labels.data(), batch.labels.size());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(features_.data(), host_features_.data(),
                                              batch.features.size() * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels_.data(), host_labels_.data(),
                                              batch.labels.size(), cudaMemcpyHostToDevice,
                                              stream_));
  return absl::OkStatus();
}

absl::Status DeviceTrainer::InitializeModel() {
  std::vector<float> x(num_params_);
  if (rank_ == 0) {
    model_->Initialize(config_.seed(), absl::MakeSpan(x));
    RETURN_IF_ERROR(client_->PushModel(x));
  }
  RETURN_IF_ERROR(client_->PullModel(absl::MakeSpan(x), /*wait_for_init=*/true));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x_.data(), x.data(), x.size() * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<float> DeviceTrainer::Step() {
  const uint64_t index = step_ % steps_per_epoch_;
  if (index == 0) batcher_.StartEpoch(step_ / steps_per_epoch_);
  const Batch batch = batcher_.Get(index);
  StepTiming timing;
  timing.compute_start = absl::Now();
  RETURN_IF_ERROR(Upload(batch));
  RETURN_IF_ERROR(model_->LossAndGradientDevice(x_.data(), features_.data(),
                                                labels_.data(), batch.size, grad_.data(),
                                                loss_.data(), stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_loss_.data(), loss_.data(),
                                              sizeof(float), cudaMemcpyDeviceToHost,
                                              stream_));
  // The gather waits for the gradient anyway; waiting here costs only the
  // direction kernel's launch, and a diverged loss stops the step before it
  // is pushed, as on the host.
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const float loss = host_loss_.data()[0];
  RETURN_IF_ERROR(EndCompute(slowdown_, timing.compute_start, loss, rank_, step_));
  timing.algorithm_start = absl::Now();
  timing.waited_before = client_->wait_time();
  const float lr = schedule_.At(step_);
  RETURN_IF_ERROR(algorithm_->Step(step_, lr, grad_.data(), x_.data()));
  ++step_;
  if (metrics_ != nullptr) {
    RecordStep(*metrics_, *client_, timing, batch_size_, loss, lr, AchievedCompression());
  }
  return loss;
}

double DeviceTrainer::AchievedCompression() const {
  const uint64_t floats = TrainingFloatsPushed(*client_);
  return floats == 0 ? 0.0 : static_cast<double>(step_) * num_params_ / floats;
}

absl::StatusOr<EvalSums> DeviceTrainer::Evaluate(const float* params) {
  EvalSums total;
  SequentialBatches batches(*test_, kEvalBatch);
  for (size_t i = 0; i < batches.count(); ++i) {
    const Batch batch = batches.Get(i);
    RETURN_IF_ERROR(Upload(batch));
    RETURN_IF_ERROR(model_->EvaluateDevice(params, features_.data(), labels_.data(),
                                           batch.size, loss_sum_.data(), correct_.data(),
                                           stream_));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_loss_sum_.data(), loss_sum_.data(),
                                                sizeof(double), cudaMemcpyDeviceToHost,
                                                stream_));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        host_correct_.data(), correct_.data(), sizeof(unsigned long long),
        cudaMemcpyDeviceToHost, stream_));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    total.loss_sum += host_loss_sum_.data()[0];
    total.correct += host_correct_.data()[0];
    total.count += batch.size;
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
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(x.data(), x_.data(), x.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return x;
}

absl::Status DeviceTrainer::FinishTraining() {
  final_.training_floats_pushed = TrainingFloatsPushed(*client_);
  final_.achieved_compression = AchievedCompression();
  ASSIGN_OR_RETURN(const EvalSums local, EvaluateTest());
  final_.local_accuracy = Accuracy(local);
  RETURN_IF_ERROR(algorithm_->Finish(step_, x_.data()));
  std::vector<float> global(num_params_);
  RETURN_IF_ERROR(client_->PullModel(absl::MakeSpan(global), /*wait_for_init=*/false));
  // Training is over: the gradient buffer holds the servers' model.
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grad_.data(), global.data(),
                                              global.size() * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
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
  const EpochLoop loop{&config_, client_, &schedule_, steps_per_epoch_, batch_size_, ""};
  RETURN_IF_ERROR(RunEpochs(
      loop, start, [this] { return Step(); }, [this] { return EvaluateTest(); }, &curve_));
  RETURN_IF_ERROR(FinishTraining());
  LogFinal("", final_);
  TrainingSummary summary;
  summary.config = &config_;
  summary.client = client_;
  summary.rank = rank_;
  summary.num_params = num_params_;
  summary.steps = step_;
  summary.batch_size = batch_size_;
  summary.curve = &curve_;
  summary.final_report = &final_;
  summary.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return WriteTrainingSummary(summary);
}

}  // namespace cserps
