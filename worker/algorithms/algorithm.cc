#include "worker/algorithms/algorithm.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grbs.h"
#include "common/status.h"

namespace cserps {

PendingAverage::PendingAverage(Algorithm* owner, std::unique_ptr<StagingDevice> staging,
                               std::unique_ptr<StagedRound> round, ScatterKind kind,
                               float alpha)
    : owner_(owner),
      staging_(std::move(staging)),
      round_(std::move(round)),
      kind_(kind),
      alpha_(alpha) {}

PendingAverage::PendingAverage(PendingAverage&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      staging_(std::move(other.staging_)),
      round_(std::move(other.round_)),
      kind_(other.kind_),
      alpha_(other.alpha_) {}

PendingAverage& PendingAverage::operator=(PendingAverage&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    staging_ = std::move(other.staging_);
    round_ = std::move(other.round_);
    kind_ = other.kind_;
    alpha_ = other.alpha_;
  }
  return *this;
}

PendingAverage::~PendingAverage() { Release(); }

absl::Status PendingAverage::Complete(float* target) {
  if (round_ == nullptr) {
    return absl::FailedPreconditionError("PendingAverage::Complete: already completed");
  }
  const absl::Status landed = round_->Land(kind_, alpha_, target);
  Release();
  return landed;
}

void PendingAverage::Release() {
  // The round waits for its replies before its staging device is reused.
  round_.reset();
  if (owner_ != nullptr && staging_ != nullptr) owner_->ReturnStaging(std::move(staging_));
  owner_ = nullptr;
}

Algorithm::Algorithm(const AlgorithmContext& context, std::vector<DeviceVector*> state,
                     std::vector<DeviceVector*> scratch, int staging_devices)
    : context_(context),
      rule_(MakeDirectionRule(context.config->optimizer())),
      state_(std::move(state)),
      scratch_(std::move(scratch)),
      staging_devices_(staging_devices) {}

Algorithm::~Algorithm() = default;

absl::Status Algorithm::Init() {
  // Here rather than at the first average: on a node, a local rank that
  // cannot make its staging would leave its peers waiting in that average.
  // A full average (checkpoints, admissions) needs one even where the steps
  // need none (the sparse methods).
  const bool full_averages = config().checkpoint().every_steps() > 0 ||
                             config().cluster().admit_every_steps() > 0;
  const int staging = std::max(staging_devices_, full_averages ? 1 : 0);
  for (int i = 0; i < staging; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> staging,
                     ops().MakeStaging(context_.group));
    idle_staging_.push_back(std::move(staging));
  }
  for (DeviceVector* buffer : state_) RETURN_IF_ERROR(Allocate(buffer));
  for (DeviceVector* buffer : scratch_) RETURN_IF_ERROR(Allocate(buffer));
  if (rule_.kind == v1::OptimizerConfig::NONE) return absl::OkStatus();
  return Allocate(&momentum_);
}

absl::Status Algorithm::SettleForCheckpoint(const float*) { return absl::OkStatus(); }

absl::Status Algorithm::AverageForCheckpoint(uint64_t steps, float* x) {
  RETURN_IF_ERROR(
      Average(v1::CHECKPOINT, steps, /*ratio=*/1, /*lr=*/0, x, ScatterKind::kAssign, 0, x));
  return AdoptGlobalModel(x);
}

std::vector<float*> Algorithm::StateBuffers() {
  std::vector<float*> buffers;
  if (momentum_.data() != nullptr) buffers.push_back(momentum_.data());
  for (DeviceVector* buffer : state_) buffers.push_back(buffer->data());
  return buffers;
}

absl::Status Algorithm::ResumeAfter(uint64_t) { return absl::OkStatus(); }

absl::Status Algorithm::AdoptGlobalModel(const float*) { return absl::OkStatus(); }

absl::Status Algorithm::Finish(uint64_t step, float* x) {
  return AverageModel(step, /*ratio=*/1, x);
}

absl::Status Algorithm::Allocate(DeviceVector* buffer) {
  ASSIGN_OR_RETURN(*buffer, ops().Allocate());
  return absl::OkStatus();
}

std::vector<uint64_t> Algorithm::Blocks(v1::Stream stream, uint64_t t,
                                        uint32_t ratio) const {
  return SelectBlocks(config().seed(), stream, t, ratio,
                      context_.comm->layout().num_blocks());
}

absl::Status Algorithm::AverageModel(uint64_t t, uint32_t ratio, float* x) {
  return Average(v1::MODEL, t, ratio, /*lr=*/0, x, ScatterKind::kAssign, 0, x);
}

absl::Status Algorithm::AverageGradient(uint64_t t, uint32_t ratio, float lr,
                                        const float* p, float* target) {
  return Average(v1::GRAD, t, ratio, lr, p, ScatterKind::kAssign, 0, target);
}

absl::Status Algorithm::DescendByAverage(uint64_t t, uint32_t ratio, float lr,
                                         const float* p, float* x) {
  // x + (−η)·mean is x − η·mean to the bit.
  return Average(v1::GRAD, t, ratio, lr, p, ScatterKind::kAxpy, -lr, x);
}

absl::StatusOr<PendingAverage> Algorithm::StartModelAverage(uint64_t t,
                                                           const float* values) {
  return StartPending(v1::MODEL, t, /*lr=*/0, values, ScatterKind::kAssign, 0);
}

absl::StatusOr<PendingAverage> Algorithm::StartGradientAverage(uint64_t t, float lr,
                                                              const float* values) {
  return StartPending(v1::GRAD, t, lr, values, ScatterKind::kAxpy, -lr);
}

StagedAverageSpec Algorithm::Spec(v1::Stream stream, uint64_t t, uint32_t ratio) const {
  StagedAverageSpec spec;
  spec.layout = &context_.comm->layout();
  spec.job_seed = config().seed();
  spec.stream = stream;
  spec.step = t;
  spec.ratio = ratio;
  spec.weight = context_.weight;
  spec.group = context_.group;
  return spec;
}

absl::Status Algorithm::Average(v1::Stream stream, uint64_t t, uint32_t ratio, float lr,
                                const float* values, ScatterKind kind, float alpha,
                                float* target) {
  ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> staging, TakeStaging());
  Communicator& comm = *context_.comm;
  const absl::Status status = StagedAverage(
      Spec(stream, t, ratio),
      [&](float weight) { return comm.BeginShardedAverage(stream, t, ratio, weight, lr); },
      *staging, values, kind, alpha, target);
  ReturnStaging(std::move(staging));
  return status;
}

absl::StatusOr<PendingAverage> Algorithm::StartPending(v1::Stream stream, uint64_t t,
                                                      float lr, const float* values,
                                                      ScatterKind kind, float alpha) {
  ASSIGN_OR_RETURN(std::unique_ptr<StagingDevice> staging, TakeStaging());
  Communicator& comm = *context_.comm;
  absl::StatusOr<std::unique_ptr<StagedRound>> round = StartStagedAverage(
      Spec(stream, t, /*ratio=*/1),
      [&](float weight) { return comm.BeginShardedAverage(stream, t, 1, weight, lr); },
      *staging, values);
  if (!round.ok()) {
    ReturnStaging(std::move(staging));
    return round.status();
  }
  return PendingAverage(this, std::move(staging), *std::move(round), kind, alpha);
}

absl::StatusOr<std::unique_ptr<StagingDevice>> Algorithm::TakeStaging() {
  if (idle_staging_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "algorithm ", algorithm().name(), ": more averages at once than its ",
        staging_devices_, " staging device(s)"));
  }
  std::unique_ptr<StagingDevice> staging = std::move(idle_staging_.back());
  idle_staging_.pop_back();
  return staging;
}

void Algorithm::ReturnStaging(std::unique_ptr<StagingDevice> staging) {
  idle_staging_.push_back(std::move(staging));
}

}  // namespace cserps
