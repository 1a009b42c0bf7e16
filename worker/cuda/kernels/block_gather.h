// Moving GRBS-selected blocks (common/grbs.h) between a flat model-sized
// device buffer and a contiguous staging buffer: the device side of
// ShardPayload::Gather / Scatter (common/block_layout.h) for a push or a
// pull, and the updates CSER applies to the received blocks (ALGORITHMS.md):
//   MODEL stream, x[S] ← AVG(x[S])       LaunchScatterBlocks into x
//   GRAD stream,  x[S] ← x[S] − η·AVG    LaunchScatterAxpyBlocks, alpha = −η
//                 (or: p ← AVG on S, then x ← x − η·p, update_kernels.h)
//   EF-SGD / QSparse, e[S] ← 0           LaunchFillBlocks
//
// The model has `num_params` floats cut into blocks of `block_size` (the
// last block may be shorter); a BlockList names the selected blocks. The
// staging buffer holds them concatenated in that order, so block ids[i]
// starts at staging[i * block_size] and only the final selected block may
// be short: GatheredFloats() floats in all. Because shards own consecutive
// block ranges, each shard's payload is a contiguous run of it.
//
// Launchers queue on `stream` and return at once; buffers must stay valid
// until the queued work has run, and staging must not overlap the model.
// InvalidArgument for block_size == 0.
#ifndef CSERPS_WORKER_CUDA_KERNELS_BLOCK_GATHER_H_
#define CSERPS_WORKER_CUDA_KERNELS_BLOCK_GATHER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace cserps {
namespace cuda {

// Floats that the blocks `sorted_blocks` (host copy, ascending) of a model
// of num_params floats cover: the staging size.
uint64_t GatheredFloats(uint64_t num_params, uint32_t block_size,
                        absl::Span<const uint64_t> sorted_blocks);

// The selected blocks of a model of `num_params` floats in blocks of
// `block_size`: `ids` is a DEVICE array of `count` block ids, ascending and
// distinct as SelectBlocks returns them (checked on the host by nobody:
// violating it is a programmer error).
struct BlockList {
  uint64_t num_params = 0;
  uint32_t block_size = 0;
  const uint64_t* ids = nullptr;
  uint64_t count = 0;
};

// staging[...] = model[selected blocks].
absl::Status LaunchGatherBlocks(const float* model, const BlockList& blocks, float* staging,
                                cudaStream_t stream);

// model[selected blocks] = staging[...]; other floats untouched.
absl::Status LaunchScatterBlocks(const float* staging, const BlockList& blocks, float* model,
                                 cudaStream_t stream);

// model[j] = model[j] + alpha * staging[k] on the selected blocks, each
// product and sum rounded separately (never an FMA): with alpha = -lr this
// is bit-identical to the CPU's x[j] -= lr * v[k].
absl::Status LaunchScatterAxpyBlocks(const float* staging, float alpha,
                                     const BlockList& blocks, float* model,
                                     cudaStream_t stream);

// model[selected blocks] = value.
absl::Status LaunchFillBlocks(float value, const BlockList& blocks, float* model,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_BLOCK_GATHER_H_
