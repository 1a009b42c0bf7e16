// Elementwise kernels of the device algorithms (worker/device/device_ops.h)
// that update_kernels.h and block_gather.h do not cover: the device twins of
// loops of worker/algorithms/. Each is bit-identical to the host loop written
// above it: every product, quotient and sum is rounded on its own
// (__fmul_rn / __fdiv_rn / __fadd_rn / __fsub_rn, never fused into an FMA, as
// the CPU build's -ffp-contract=off), in the host expression's order.
//
// Launchers queue on `stream` and return at once; every pointer is device
// memory that stays valid until the queued work has run. n == 0 (or
// count == 0) queues nothing. The Status reports a failed launch, or
// InvalidArgument for an op or momentum kind the launcher does not know.
#ifndef CSERPS_WORKER_CUDA_KERNELS_VECTOR_KERNELS_H_
#define CSERPS_WORKER_CUDA_KERNELS_VECTOR_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/direction.h"

namespace cserps {
namespace cuda {

// What LaunchScatterSparse writes: the kernels' copy of SparseOp
// (worker/device/device_ops.h), which CudaDeviceOps maps to it. A copy
// because device_ops.h pulls in the gRPC client headers, which the kernels'
// nvcc build should not compile.
enum class ScatterOp {
  kZero,
  kAssignDivided,
  kSubtractDivided,
};

// x[i] = x[i] * factor, or (divide) x[i] / factor: the host's v * factor
// and v / factor, each rounded once (a node's staged average,
// StagingDevice::ScaleStaging).
absl::Status LaunchScale(size_t n, bool divide, float factor, float* x,
                         cudaStream_t stream);

// out[i] = a * p[i] + e[i]. `out` may alias `e` or `p`.
absl::Status LaunchScaleAdd(size_t n, float a, const float* p, const float* e,
                            float* out, cudaStream_t stream);

// out[i] = e[i] + (a[i] - b[i]). `out` may alias any input.
absl::Status LaunchAddDifference(size_t n, const float* e, const float* a,
                                 const float* b, float* out,
                                 cudaStream_t stream);

// r[i] = r[i] + lr * (g[i] + lambda * x[i]).
absl::Status LaunchAccumulate(size_t n, float lr, float lambda, const float* g,
                              const float* x, float* r, cudaStream_t stream);

// For e < count, with j = indices[e] (DEVICE arrays; indices distinct, each
// below the length of x, unchecked: a programmer error):
//   kZero:            x[j] = 0                     (values unused, may be null)
//   kAssignDivided:   x[j] = values[e] / divisor
//   kSubtractDivided: x[j] = x[j] - values[e] / divisor
absl::Status LaunchScatterSparse(ScatterOp op, size_t count,
                                 const uint32_t* indices, const float* values,
                                 float divisor, float* x, cudaStream_t stream);

// Momentum on a shared update u (the sparse methods' line 6), β = rule.beta:
//   m[i] = beta * m[i] + u[i];
//   x[i] = x[i] - (NESTEROV ? u[i] + beta * m[i] : m[i])   (m[i] the new one)
// rule.kind HEAVY_BALL or NESTEROV; InvalidArgument otherwise.
absl::Status LaunchApplyMomentum(const DirectionRule& rule, size_t n,
                                 const float* u, float* m, float* x,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_VECTOR_KERNELS_H_
