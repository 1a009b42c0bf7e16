// The local optimizer step on flat device buffers: the device twin of
// common/direction.h (ComputeDirection) and of the algorithms'
// x -= lr * p. With λ = weight_decay and β = momentum:
//   NONE (or MOMENTUM_UNSPECIFIED): p = g + λx
//   HEAVY_BALL:                     m ← βm + (g + λx);  p = m
//   NESTEROV:                       d = g + λx;  m ← βm + d;  p = d + βm
//
// Bit-identical to the CPU code: every product and sum is rounded on its own
// (__fmul_rn / __fadd_rn, never fused into an FMA, as the CPU build's
// -ffp-contract=off), in the CPU code's order, so workers on either backend
// and the servers keep the same bits.
//
// Launchers queue on `stream` and return at once; all pointers are device
// pointers of n floats that stay valid until the queued work has run. The
// Status reports a failed launch or an unknown momentum kind.
#ifndef CSERPS_WORKER_CUDA_KERNELS_UPDATE_KERNELS_H_
#define CSERPS_WORKER_CUDA_KERNELS_UPDATE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "cserps/v1/config.pb.h"
#include "common/direction.h"

namespace cserps {
namespace cuda {

// direction = p(grad, params), advancing `momentum` (unused, may be null,
// for NONE). `direction` may alias `grad`, as in ComputeDirection.
absl::Status LaunchDirection(const DirectionRule& rule, size_t n,
                             const float* grad, const float* params,
                             float* momentum, float* direction,
                             cudaStream_t stream);

// params[i] = params[i] - lr * direction[i].
absl::Status LaunchDescend(size_t n, float lr, const float* direction,
                           float* params, cudaStream_t stream);

// LaunchDirection then LaunchDescend in one pass, without storing p: the
// weight decay reads params before they move. Same bits as the two launches.
absl::Status LaunchSgdStep(const DirectionRule& rule, size_t n, float lr,
                           const float* grad, float* momentum, float* params,
                           cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_UPDATE_KERNELS_H_
