// The local descent direction p = Direction(g) of ALGORITHMS.md ("Direction"):
// the gradient plus weight decay, optionally through a momentum buffer (a
// worker's own, never synchronised unless an algorithm says so; or the
// servers', for asynchronous SGD). With λ = weight_decay and β = momentum:
//   NONE (or MOMENTUM_UNSPECIFIED): p = g + λx
//   HEAVY_BALL:                     m ← βm + (g + λx);  p = m
//   NESTEROV:                       d = g + λx;  m ← βm + d;  p = d + βm
// The momentum buffer starts at zero. Beside it, the step along a direction
// and the momentum on an update that every member shares (gTop-k's).
// Element-wise loops, in AVX2 where the CPU has it (common/vector_clones.h):
// the same bits either way.
#ifndef CSERPS_COMMON_DIRECTION_H_
#define CSERPS_COMMON_DIRECTION_H_

#include <cstddef>

#include "cserps/v1/config.pb.h"

namespace cserps {

// The rule, read from the optimizer config; what the device operations
// (worker/device/device_ops.h) are given.
struct DirectionRule {
  v1::OptimizerConfig::Momentum kind = v1::OptimizerConfig::NONE;
  float beta = 0.0f;          // momentum
  float weight_decay = 0.0f;  // λ
};
// MOMENTUM_UNSPECIFIED becomes NONE.
DirectionRule MakeDirectionRule(const v1::OptimizerConfig& config);
// HEAVY_BALL or NESTEROV: the rule keeps a momentum buffer.
inline bool UsesMomentum(v1::OptimizerConfig::Momentum kind) {
  return kind == v1::OptimizerConfig::HEAVY_BALL || kind == v1::OptimizerConfig::NESTEROV;
}

// direction[i] = p(grad, params)[i] for i < n, advancing `momentum` (n
// floats; unused, may be null, for NONE). `direction` may alias `grad`.
// The one host implementation of the rule: the host device ops
// (worker/device/host_device_ops.h) and the servers' asynchronous SGD
// (server/async_service.cc) call it. An unknown kind is a programmer error
// and aborts.
void ComputeDirection(const DirectionRule& rule, size_t n, const float* grad,
                      const float* params, float* momentum, float* direction);

// x[i] -= lr * p[i] for i < n: the step along a direction. The one host
// implementation: the host device ops and the shards' GRAD rule and
// asynchronous step (server/shard_store.cc) call it.
void Descend(float lr, size_t n, const float* p, float* x);

// Momentum on an update u that every member shares (the sparse methods'
// line 6): m = βm + u, then x -= (NESTEROV ? u + βm : m), for i < n. The
// one host implementation: the host device ops and the servers' sparse
// exchange (server/sparse_exchange_service.cc) call it, so workers and
// servers hold the same bits. rule.kind is HEAVY_BALL or NESTEROV; another
// is a programmer error and aborts.
void ApplySharedMomentum(const DirectionRule& rule, size_t n, const float* u, float* momentum,
                         float* x);

}  // namespace cserps

#endif  // CSERPS_COMMON_DIRECTION_H_
