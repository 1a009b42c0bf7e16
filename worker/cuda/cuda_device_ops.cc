#include "worker/cuda/cuda_device_ops.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/kernels/block_gather.h"
#include "worker/cuda/cuda_staging.h"
#include "worker/cuda/device_group.h"
#include "worker/cuda/kernels/topk.h"
#include "worker/cuda/kernels/update_kernels.h"
#include "worker/cuda/kernels/vector_kernels.h"

namespace cserps {
namespace {

absl::StatusOr<cuda::ScatterOp> ScatterOpOf(SparseOp op) {
  switch (op) {
    case SparseOp::kZero:
      return cuda::ScatterOp::kZero;
    case SparseOp::kAssignDivided:
      return cuda::ScatterOp::kAssignDivided;
    case SparseOp::kSubtractDivided:
      return cuda::ScatterOp::kSubtractDivided;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("CudaDeviceOps::ScatterSparse: unknown op ", static_cast<int>(op)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceOps>> CudaDeviceOps::Create(
    uint64_t num_params, uint32_t block_size, cudaStream_t stream, DeviceGroup* node_group) {
  if (block_size == 0) {
    return absl::InvalidArgumentError("CudaDeviceOps: block_size is 0");
  }
  std::unique_ptr<CudaDeviceOps> ops(
      new CudaDeviceOps(num_params, block_size, stream, node_group));
  ASSIGN_OR_RETURN(ops->host_, PinnedBuffer<float>::Allocate(num_params));
  RETURN_IF_ERROR(ops->blocks_.Reserve((num_params + block_size - 1) / block_size, stream));
  return ops;
}

CudaDeviceOps::~CudaDeviceOps() {
  // Errors here can only repeat an earlier asynchronous fault.
  static_cast<void>(cudaStreamSynchronize(stream_));
}

template <typename Buffer>
absl::Status CudaDeviceOps::Reserve(Buffer& buffer, size_t count) {
  if (buffer.size() >= count) return absl::OkStatus();
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  buffer.Reset();
  ASSIGN_OR_RETURN(buffer, Buffer::Allocate(count));
  return absl::OkStatus();
}

absl::StatusOr<DeviceVector> CudaDeviceOps::Allocate() {
  if (num_params_ == 0) return DeviceVector();
  void* memory = nullptr;
  const size_t bytes = num_params_ * sizeof(float);
  const cudaError_t error = cudaMalloc(&memory, bytes);
  if (error != cudaSuccess) {
    return CudaStatus(error, absl::StrCat("cudaMalloc(", bytes, " bytes)"), __FILE__,
                      __LINE__);
  }
  DeviceVector vector(static_cast<float*>(memory),
                      [](float* p) { static_cast<void>(cudaFree(p)); });
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(vector.data(), 0, bytes, stream_));
  return vector;
}

absl::StatusOr<std::unique_ptr<StagingDevice>> CudaDeviceOps::MakeStaging(
    LocalGroup* group) {
  if (group != nullptr && node_group_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CudaDeviceOps::MakeStaging on local rank ", group->local_rank(), " of ",
        group->size(),
        ": a node of GPUs needs its group's collectives on the device (the NCCL "
        "group, worker/cuda/nccl_group.h), but these ops were made without one"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaStagingDevice> staging,
                   CudaStagingDevice::Create(*this,
                                             group != nullptr ? node_group_ : nullptr));
  return std::unique_ptr<StagingDevice>(std::move(staging));
}

absl::Status CudaDeviceOps::Upload(absl::Span<const float> host, float* dst) {
  if (host.size() != num_params_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDeviceOps::Upload: ", host.size(),
                                                   " floats; the model has ", num_params_));
  }
  if (num_params_ == 0) return absl::OkStatus();
  std::memcpy(host_.data(), host.data(), host_.bytes());
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, host_.data(), host_.bytes(), cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDeviceOps::Download(const float* src, absl::Span<float> host) {
  if (host.size() != num_params_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDeviceOps::Download: ", host.size(),
                                                   " floats; the model has ", num_params_));
  }
  if (num_params_ == 0) return absl::OkStatus();
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_.data(), src, host_.bytes(), cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::memcpy(host.data(), host_.data(), host_.bytes());
  return absl::OkStatus();
}

absl::Status CudaDeviceOps::Copy(const float* src, float* dst) {
  if (num_params_ == 0 || src == dst) return absl::OkStatus();
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, num_params_ * sizeof(float),
                                              cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaDeviceOps::Direction(const DirectionRule& rule, const float* g,
                                      const float* x, float* m, float* p) {
  return cuda::LaunchDirection(rule, num_params_, g, x, m, p, stream_);
}

absl::Status CudaDeviceOps::Descend(float lr, const float* p, float* x) {
  return cuda::LaunchDescend(num_params_, lr, p, x, stream_);
}

absl::Status CudaDeviceOps::SgdStep(const DirectionRule& rule, float lr, const float* g,
                                    float* m, float* x) {
  return cuda::LaunchSgdStep(rule, num_params_, lr, g, m, x, stream_);
}

absl::Status CudaDeviceOps::ScaleAdd(float a, const float* p, const float* e,
                                     float* out) {
  return cuda::LaunchScaleAdd(num_params_, a, p, e, out, stream_);
}

absl::Status CudaDeviceOps::AddDifference(const float* e, const float* a, const float* b,
                                          float* out) {
  return cuda::LaunchAddDifference(num_params_, e, a, b, out, stream_);
}

absl::Status CudaDeviceOps::FillBlocks(absl::Span<const uint64_t> blocks, float value,
                                       float* x) {
  const uint64_t num_blocks = blocks_.capacity();
  if (blocks.size() > num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDeviceOps::FillBlocks: ",
                                                   blocks.size(), " blocks; the model has ",
                                                   num_blocks));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] >= num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaDeviceOps::FillBlocks: blocks[", i, "] = ", blocks[i],
                       "; the model has ", num_blocks, " blocks"));
    }
  }
  if (blocks.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(blocks_.Upload(blocks, stream_));
  return cuda::LaunchFillBlocks(
      value, {num_params_, block_size_, blocks_.data(), blocks.size()}, x, stream_);
}

absl::Status CudaDeviceOps::Accumulate(float lr, float lambda, const float* g,
                                       const float* x, float* r) {
  return cuda::LaunchAccumulate(num_params_, lr, lambda, g, x, r, stream_);
}

absl::Status CudaDeviceOps::TopK(const float* values, absl::Span<const TopKRange> ranges,
                                 SparseVector* out) {
  out->indices.clear();
  out->values.clear();
  uint64_t total = 0;
  size_t workspace_bytes = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const TopKRange& range = ranges[i];
    if (range.size > num_params_ || range.offset > num_params_ - range.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaDeviceOps::TopK: ranges[", i, "] = [", range.offset, ", +", range.size,
          ") exceeds the model of ", num_params_, " floats"));
    }
    if (range.offset + range.size > (uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaDeviceOps::TopK: ranges[", i, "] = [", range.offset, ", +", range.size,
          ") has positions of 2^32 or more"));
    }
    total += std::min(range.k, range.size);
    ASSIGN_OR_RETURN(const size_t bytes, cuda::TopKWorkspaceBytes(range.size, range.k));
    workspace_bytes = std::max(workspace_bytes, bytes);
  }
  if (total == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Reserve(topk_workspace_, workspace_bytes));
  RETURN_IF_ERROR(Reserve(topk_positions_, total));
  RETURN_IF_ERROR(Reserve(topk_values_, total));
  RETURN_IF_ERROR(Reserve(host_topk_positions_, total));
  RETURN_IF_ERROR(Reserve(host_topk_values_, total));
  uint64_t first = 0;
  for (const TopKRange& range : ranges) {
    const uint64_t kept = std::min(range.k, range.size);
    if (kept == 0) continue;
    RETURN_IF_ERROR(cuda::LaunchTopK(values + range.offset, range.size, range.k,
                                     topk_workspace_.data(), topk_workspace_.bytes(),
                                     topk_positions_.data() + first,
                                     topk_values_.data() + first, stream_));
    first += kept;
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_topk_positions_.data(),
                                              topk_positions_.data(),
                                              total * sizeof(uint32_t),
                                              cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_topk_values_.data(), topk_values_.data(),
                                              total * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  out->indices.reserve(total);
  out->values.assign(host_topk_values_.data(), host_topk_values_.data() + total);
  first = 0;
  for (const TopKRange& range : ranges) {
    const uint64_t kept = std::min(range.k, range.size);
    for (uint64_t i = 0; i < kept; ++i) {
      out->indices.push_back(
          static_cast<uint32_t>(range.offset + host_topk_positions_.data()[first + i]));
    }
    first += kept;
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceOps::ScatterSparse(SparseOp op, absl::Span<const uint32_t> indices,
                                          absl::Span<const float> values, float divisor,
                                          float* x) {
  ASSIGN_OR_RETURN(const cuda::ScatterOp scatter_op, ScatterOpOf(op));
  const bool with_values = op != SparseOp::kZero;
  if (with_values && values.size() != indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CudaDeviceOps::ScatterSparse: ",
                                                   values.size(), " values for ",
                                                   indices.size(), " indices"));
  }
  // Distinct indices inside the model are at most num_params.
  if (indices.size() > num_params_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaDeviceOps::ScatterSparse: ", indices.size(),
                     " indices; the model has ", num_params_, " floats"));
  }
  for (size_t e = 0; e < indices.size(); ++e) {
    if (indices[e] >= num_params_) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaDeviceOps::ScatterSparse: indices[", e, "] = ", indices[e],
                       "; the model has ", num_params_, " floats"));
    }
  }
  const size_t count = indices.size();
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(sparse_indices_.Reserve(count, stream_));
  RETURN_IF_ERROR(sparse_indices_.Upload(indices, stream_));
  const float* device_values = nullptr;
  if (with_values) {
    RETURN_IF_ERROR(sparse_values_.Reserve(count, stream_));
    RETURN_IF_ERROR(sparse_values_.Upload(values, stream_));
    device_values = sparse_values_.data();
  }
  return cuda::LaunchScatterSparse(scatter_op, count, sparse_indices_.data(), device_values,
                                   divisor, x, stream_);
}

absl::Status CudaDeviceOps::ApplyMomentum(const DirectionRule& rule, const float* u,
                                          float* m, float* x) {
  return cuda::LaunchApplyMomentum(rule, num_params_, u, m, x, stream_);
}

}  // namespace cserps
