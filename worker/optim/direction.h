// The local descent direction p = Direction(g) of ALGORITHMS.md ("Direction"):
// the gradient plus weight decay, optionally through a momentum buffer that
// belongs to this worker and is never synchronised unless an algorithm says
// so. With λ = weight_decay and β = momentum:
//   NONE (or MOMENTUM_UNSPECIFIED): p = g + λx
//   HEAVY_BALL:                     m ← βm + (g + λx);  p = m
//   NESTEROV:                       d = g + λx;  m ← βm + d;  p = d + βm
// The momentum buffer starts at zero.
//
// Not thread-safe; one Direction per worker model.
#ifndef CSERPS_WORKER_OPTIM_DIRECTION_H_
#define CSERPS_WORKER_OPTIM_DIRECTION_H_

#include <cstddef>
#include <vector>

#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// The rule of a Direction, read from the optimizer config; also what the
// device twins of Direction (worker/device/device_ops.h) are given.
struct DirectionRule {
  v1::OptimizerConfig::Momentum kind = v1::OptimizerConfig::NONE;
  float beta = 0.0f;          // momentum
  float weight_decay = 0.0f;  // λ
};
// MOMENTUM_UNSPECIFIED becomes NONE.
DirectionRule MakeDirectionRule(const v1::OptimizerConfig& config);

// direction[i] = p(grad, params)[i] for i < n, advancing `momentum` (n
// floats; unused, may be null, for NONE). `direction` may alias `grad`.
// The one host implementation of the rule: Direction and the host device
// (worker/device/host_device_ops.h) both call it, so they agree bit for bit.
// An unknown kind is a programmer error and aborts.
void ComputeDirection(const DirectionRule& rule, size_t n, const float* grad,
                      const float* params, float* momentum, float* direction);

class Direction {
 public:
  // `config` must have passed the job config validation; an unknown
  // momentum_kind is a programmer error and aborts.
  Direction(const v1::OptimizerConfig& config, size_t num_params);

  // Writes p = Direction(grad) at `params` into `direction` and advances the
  // momentum buffer. All three spans have num_params floats; `direction` may
  // alias `grad` (each element is read before it is written).
  void Compute(absl::Span<const float> grad, absl::Span<const float> params,
               absl::Span<float> direction);

  // The momentum buffer: num_params floats, or empty for NONE.
  absl::Span<const float> momentum() const { return momentum_; }
  // For algorithms that reset or average the buffer; same size as momentum().
  absl::Span<float> mutable_momentum() { return absl::MakeSpan(momentum_); }

 private:
  DirectionRule rule_;
  size_t num_params_;
  std::vector<float> momentum_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_OPTIM_DIRECTION_H_
