#include "worker/cuda/cuda_staging.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/block_gather.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<CudaStagingDevice>> CudaStagingDevice::Create(
    uint64_t num_params, uint32_t block_size, cudaStream_t compute) {
  if (block_size == 0) {
    return absl::InvalidArgumentError("CudaStagingDevice: block_size is 0");
  }
  std::unique_ptr<CudaStagingDevice> device(
      new CudaStagingDevice(num_params, block_size, compute));
  const uint64_t num_blocks = (num_params + block_size - 1) / block_size;
  ASSIGN_OR_RETURN(device->staging_, DeviceBuffer<float>::Allocate(num_params));
  ASSIGN_OR_RETURN(device->host_, PinnedBuffer<float>::Allocate(num_params));
  ASSIGN_OR_RETURN(device->blocks_, DeviceBuffer<uint64_t>::Allocate(num_blocks));
  ASSIGN_OR_RETURN(device->host_blocks_, PinnedBuffer<uint64_t>::Allocate(num_blocks));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&device->copy_, cudaStreamNonBlocking));
  for (cudaEvent_t* event :
       {&device->blocks_uploaded_, &device->gathered_, &device->returned_}) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
  }
  return device;
}

CudaStagingDevice::~CudaStagingDevice() {
  // Errors here can only repeat an earlier asynchronous fault.
  if (copy_ != nullptr) static_cast<void>(cudaStreamSynchronize(copy_));
  if (compute_ != nullptr) static_cast<void>(cudaStreamSynchronize(compute_));
  for (cudaEvent_t event : copied_) static_cast<void>(cudaEventDestroy(event));
  for (cudaEvent_t event : {blocks_uploaded_, gathered_, returned_}) {
    if (event != nullptr) static_cast<void>(cudaEventDestroy(event));
  }
  if (copy_ != nullptr) static_cast<void>(cudaStreamDestroy(copy_));
}

absl::Status CudaStagingDevice::Gather(const float* model,
                                       absl::Span<const uint64_t> blocks) {
  if (blocks.size() > host_blocks_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStagingDevice::Gather: ", blocks.size(), " blocks; the model has ",
        host_blocks_.size()));
  }
  if (blocks_in_flight_) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(blocks_uploaded_));
  }
  num_selected_ = blocks.size();
  if (num_selected_ > 0) {
    std::memcpy(host_blocks_.data(), blocks.data(), blocks.size() * sizeof(uint64_t));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(blocks_.data(), host_blocks_.data(),
                                                blocks.size() * sizeof(uint64_t),
                                                cudaMemcpyHostToDevice, compute_));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(blocks_uploaded_, compute_));
    blocks_in_flight_ = true;
    RETURN_IF_ERROR(cuda::LaunchGatherBlocks(model, num_params_, block_size_,
                                             blocks_.data(), num_selected_,
                                             staging_.data(), compute_));
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered_, compute_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, gathered_, 0));
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::CopyToHost(uint32_t slot, uint64_t offset,
                                           uint64_t count) {
  if (offset + count > num_params_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStagingDevice::CopyToHost: floats [", offset, ", ", offset + count,
        ") exceed the staging capacity ", num_params_));
  }
  while (copied_.size() <= slot) {
    cudaEvent_t event = nullptr;
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    copied_.push_back(event);
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_.data() + offset,
                                              staging_.data() + offset,
                                              count * sizeof(float),
                                              cudaMemcpyDeviceToHost, copy_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_[slot], copy_));
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
  if (offset + count > num_params_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStagingDevice::CopyToStaging: floats [", offset, ", ", offset + count,
        ") exceed the staging capacity ", num_params_));
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.data() + offset,
                                              host_.data() + offset,
                                              count * sizeof(float),
                                              cudaMemcpyHostToDevice, copy_));
  return absl::OkStatus();
}

absl::Status CudaStagingDevice::Scatter(ScatterKind kind, float alpha, float* model) {
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(returned_, copy_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, returned_, 0));
  if (num_selected_ == 0) return absl::OkStatus();
  if (kind == ScatterKind::kAssign) {
    return cuda::LaunchScatterBlocks(staging_.data(), num_params_, block_size_,
                                     blocks_.data(), num_selected_, model, compute_);
  }
  return cuda::LaunchScatterAxpyBlocks(staging_.data(), alpha, num_params_, block_size_,
                                       blocks_.data(), num_selected_, model, compute_);
}

namespace {

absl::Status NoNodeOnDevice(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "CudaStagingDevice::", what,
      ": a node's average has no device path yet (nodes of several GPUs run the "
      "host-span path)"));
}

}  // namespace

absl::Status CudaStagingDevice::ScaleStaging(Scale, float, uint64_t, uint64_t) {
  return NoNodeOnDevice("ScaleStaging");
}

absl::Status CudaStagingDevice::AllReduceStaging(uint64_t) {
  return NoNodeOnDevice("AllReduceStaging");
}

absl::Status CudaStagingDevice::BroadcastStaging(uint32_t, uint64_t, uint64_t) {
  return NoNodeOnDevice("BroadcastStaging");
}

}  // namespace cserps
