#include "worker/cuda/cuda_staging.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/kernels/block_gather.h"
#include "worker/cuda/kernels/vector_kernels.h"

namespace cserps {
namespace {

// Makes `waiter` wait for the work queued so far on `source`, through
// `event`, if `*pending`; clears it.
absl::Status HandOver(cudaStream_t source, cudaEvent_t event, cudaStream_t waiter,
                      bool* pending) {
  if (!*pending) return absl::OkStatus();
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, source));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(waiter, event, 0));
  *pending = false;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStagingDevice>> CudaStagingDevice::Create(
    const CudaDeviceOps& ops, DeviceGroup* group) {
  const uint64_t d = ops.num_params();
  std::unique_ptr<CudaStagingDevice> device(
      new CudaStagingDevice(d, ops.block_size(), ops.stream(), group));
  ASSIGN_OR_RETURN(device->staging_, DeviceBuffer<float>::Allocate(d));
  ASSIGN_OR_RETURN(device->host_, PinnedBuffer<float>::Allocate(d));
  // Every block of the model fits the block list.
  RETURN_IF_ERROR(device->blocks_.Reserve((d + ops.block_size() - 1) / ops.block_size(),
                                          ops.stream()));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&device->copy_, cudaStreamNonBlocking));
  for (cudaEvent_t* event : {&device->computed_, &device->returned_}) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
  }
  return device;
}

CudaStagingDevice::~CudaStagingDevice() {
  // Errors here can only repeat an earlier asynchronous fault.
  if (copy_ != nullptr) static_cast<void>(cudaStreamSynchronize(copy_));
  if (compute_ != nullptr) static_cast<void>(cudaStreamSynchronize(compute_));
  for (cudaEvent_t event : copied_) static_cast<void>(cudaEventDestroy(event));
  for (cudaEvent_t event : {computed_, returned_}) {
    if (event != nullptr) static_cast<void>(cudaEventDestroy(event));
  }
  if (copy_ != nullptr) static_cast<void>(cudaStreamDestroy(copy_));
}

// Recorded when the copy is queued rather than at the gather: a node's
// round scales and all-reduces the staging on the compute stream after the
// gather and before its first copy down.
absl::Status CudaStagingDevice::CopyAfterCompute() {
  return HandOver(compute_, computed_, copy_, &compute_pending_);
}

absl::Status CudaStagingDevice::ComputeAfterCopies() {
  return HandOver(copy_, returned_, compute_, &copies_pending_);
}

absl::Status CudaStagingDevice::CheckRange(absl::string_view what, uint64_t offset,
                                           uint64_t count) const {
  if (offset <= num_params_ && count <= num_params_ - offset) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "CudaStagingDevice::", what, ": ", count, " floats at offset ", offset,
      " exceed the staging capacity ", num_params_));
}

absl::Status CudaStagingDevice::NeedGroup(absl::string_view what) const {
  if (group_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "CudaStagingDevice::", what,
      ": the device was made without a local group (a flat worker's); a node's "
      "average needs one"));
}

absl::Status CudaStagingDevice::Gather(const float* model,
                                       absl::Span<const uint64_t> blocks) {
  if (blocks.size() > blocks_.capacity()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStagingDevice::Gather: ", blocks.size(), " blocks; the model has ",
        blocks_.capacity()));
  }
  // The previous round's copies may still read (or write) the staging.
  RETURN_IF_ERROR(ComputeAfterCopies());
  num_selected_ = blocks.size();
  if (num_selected_ > 0) {
    RETURN_IF_ERROR(blocks_.Upload(blocks, compute_));
    RETURN_IF_ERROR(
        cuda::LaunchGatherBlocks(model, Selected(), staging_.data(), compute_));
  }
  compute_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::CopyToHost(uint32_t slot, uint64_t offset,
                                           uint64_t count) {
  RETURN_IF_ERROR(CheckRange("CopyToHost", offset, count));
  while (copied_.size() <= slot) {
    cudaEvent_t event = nullptr;
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    copied_.push_back(event);
  }
  RETURN_IF_ERROR(CopyAfterCompute());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_.data() + offset,
                                              staging_.data() + offset,
                                              count * sizeof(float),
                                              cudaMemcpyDeviceToHost, copy_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[slot], copy_));
  copies_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::WaitCopied(uint32_t slot) {
  if (slot >= copied_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CudaStagingDevice::WaitCopied: no copy was queued for slot ", slot));
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(copied_[slot]));
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::CopyToStaging(uint64_t offset, uint64_t count) {
  RETURN_IF_ERROR(CheckRange("CopyToStaging", offset, count));
  RETURN_IF_ERROR(CopyAfterCompute());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.data() + offset,
                                              host_.data() + offset,
                                              count * sizeof(float),
                                              cudaMemcpyHostToDevice, copy_));
  copies_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::Scatter(ScatterKind kind, float alpha, float* model) {
  RETURN_IF_ERROR(ComputeAfterCopies());
  if (num_selected_ == 0) return absl::OkStatus();
  compute_pending_ = true;
  if (kind == ScatterKind::kAssign) {
    return cuda::LaunchScatterBlocks(staging_.data(), Selected(), model, compute_);
  }
  return cuda::LaunchScatterAxpyBlocks(staging_.data(), alpha, Selected(), model, compute_);
}

absl::Status CudaStagingDevice::ScaleStaging(Scale op, float factor, uint64_t offset,
                                             uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("ScaleStaging"));
  RETURN_IF_ERROR(CheckRange("ScaleStaging", offset, count));
  if (op != Scale::kMultiply && op != Scale::kDivide) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStagingDevice::ScaleStaging: unknown op ", static_cast<int>(op)));
  }
  RETURN_IF_ERROR(ComputeAfterCopies());
  compute_pending_ = true;
  return cuda::LaunchScale(count, op == Scale::kDivide, factor, staging_.data() + offset,
                           compute_);
}

// The collectives are ordered after the compute stream by the group and
// complete before they return, so the copies that follow them need no
// hand-over of their own.
absl::Status CudaStagingDevice::AllReduceStaging(uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("AllReduceStaging"));
  RETURN_IF_ERROR(CheckRange("AllReduceStaging", 0, count));
  RETURN_IF_ERROR(ComputeAfterCopies());
  return group_->AllReduceSumOnDevice(staging_.data(), count, compute_);
}

absl::Status CudaStagingDevice::BroadcastStaging(uint32_t root, uint64_t offset,
                                                 uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("BroadcastStaging"));
  RETURN_IF_ERROR(CheckRange("BroadcastStaging", offset, count));
  // The owner's mean came back on the copy stream (CopyToStaging).
  RETURN_IF_ERROR(ComputeAfterCopies());
  return group_->BroadcastOnDevice(root, staging_.data() + offset, count, compute_);
}

}  // namespace cserps
