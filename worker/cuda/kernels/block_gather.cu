#include "worker/cuda/kernels/block_gather.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

enum class Op { kGather, kScatter, kScatterAxpy, kFill };

// One thread per staging float: i-th selected block, offset within it. The
// division runs in 32 bits whenever the staging fits (Index = uint32_t): a
// 64-bit division would cost more than the memory traffic it serves.
template <Op kOp, typename Index>
__global__ void BlocksKernel(const float* src, float alpha, uint64_t num_params,
                             Index block_size, const uint64_t* blocks,
                             Index total, float* dst) {
  for (Index k = blockIdx.x * Index{blockDim.x} + threadIdx.x; k < total;
       k += Index{gridDim.x} * blockDim.x) {
    const Index i = k / block_size;
    const uint64_t j = blocks[i] * block_size + (k - i * block_size);
    if (j >= num_params) continue;  // past the short last block
    switch (kOp) {
      case Op::kGather:
        dst[k] = src[j];
        break;
      case Op::kScatter:
        dst[j] = src[k];
        break;
      case Op::kScatterAxpy:
        dst[j] = __fadd_rn(dst[j], __fmul_rn(alpha, src[k]));
        break;
      case Op::kFill:
        dst[j] = alpha;
        break;
    }
  }
}

template <Op kOp>
absl::Status Launch(const float* src, float alpha, const BlockList& list, float* dst,
                    cudaStream_t stream, const char* name) {
  const uint64_t num_params = list.num_params;
  const uint32_t block_size = list.block_size;
  const uint64_t* blocks = list.ids;
  const uint64_t num_blocks = list.count;
  if (block_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": block_size must be > 0"));
  }
  // Threads cover num_blocks full blocks; those past the model's end (the
  // short last block) do nothing.
  const uint64_t total = num_blocks * block_size;
  if (total == 0) return absl::OkStatus();
  const unsigned grid = GridBlocks(total);
  // The 32-bit form also needs room for k + grid stride without wrapping.
  const uint64_t stride = uint64_t{grid} * kThreads;
  if (total + stride <= std::numeric_limits<uint32_t>::max()) {
    BlocksKernel<kOp, uint32_t><<<grid, kThreads, 0, stream>>>(
        src, alpha, num_params, block_size, blocks,
        static_cast<uint32_t>(total), dst);
  } else {
    BlocksKernel<kOp, uint64_t><<<grid, kThreads, 0, stream>>>(
        src, alpha, num_params, block_size, blocks, total, dst);
  }
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED(name);
  return absl::OkStatus();
}

}  // namespace

uint64_t GatheredFloats(uint64_t num_params, uint32_t block_size,
                        absl::Span<const uint64_t> sorted_blocks) {
  uint64_t total = 0;
  for (const uint64_t b : sorted_blocks) {
    const uint64_t begin = b * block_size;
    const uint64_t end = std::min<uint64_t>(begin + block_size, num_params);
    if (end > begin) total += end - begin;
  }
  return total;
}

absl::Status LaunchGatherBlocks(const float* model, const BlockList& blocks, float* staging,
                                cudaStream_t stream) {
  return Launch<Op::kGather>(model, 0.0f, blocks, staging, stream, "GatherBlocks");
}

absl::Status LaunchScatterBlocks(const float* staging, const BlockList& blocks, float* model,
                                 cudaStream_t stream) {
  return Launch<Op::kScatter>(staging, 0.0f, blocks, model, stream, "ScatterBlocks");
}

absl::Status LaunchScatterAxpyBlocks(const float* staging, float alpha,
                                     const BlockList& blocks, float* model,
                                     cudaStream_t stream) {
  return Launch<Op::kScatterAxpy>(staging, alpha, blocks, model, stream, "ScatterAxpyBlocks");
}

absl::Status LaunchFillBlocks(float value, const BlockList& blocks, float* model,
                              cudaStream_t stream) {
  return Launch<Op::kFill>(nullptr, value, blocks, model, stream, "FillBlocks");
}

}  // namespace cuda
}  // namespace cserps
