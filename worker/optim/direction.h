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
  v1::OptimizerConfig::Momentum kind_;
  float beta_;
  float weight_decay_;
  size_t num_params_;
  std::vector<float> momentum_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_OPTIM_DIRECTION_H_
