// Top-k selection by magnitude on the device, for the sparse methods: the
// twin of SelectTopK (worker/device/topk_select.h), with the same answer. The k
// entries with the largest |value| (a NaN counts as infinite), ties broken
// by the lower position, returned as ascending positions with their values.
//
// Method: one CUB radix sort (descending) of 64-bit keys |v| bits << 32 |
// ~position, which are distinct, so the order is total and needs no stable
// sort; the first k keys give the positions, which a second, k-item radix
// sort puts in ascending order.
#ifndef CSERPS_WORKER_CUDA_KERNELS_TOPK_H_
#define CSERPS_WORKER_CUDA_KERNELS_TOPK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cserps {
namespace cuda {

// Bytes of caller-owned device workspace that LaunchTopK needs for n values
// and this k (0 when k == 0 or k >= n). InvalidArgument for n >= 2^32; a
// CUDA error when CUB cannot size its storage (no device).
absl::StatusOr<size_t> TopKWorkspaceBytes(uint64_t n, uint64_t k);

// Writes min(k, n) positions into `positions` (ascending) and
// values[positions[i]] into `selected` (bitwise, NaNs included): every
// position when k >= n. `values`, `positions`, `selected` and `workspace`
// are device memory; `workspace` holds at least TopKWorkspaceBytes(n, k)
// bytes (InvalidArgument otherwise) and must not be shared with work in
// flight. Queues on `stream`; no synchronisation, no allocation.
absl::Status LaunchTopK(const float* values, uint64_t n, uint64_t k,
                        void* workspace, size_t workspace_bytes,
                        uint32_t* positions, float* selected,
                        cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_TOPK_H_
