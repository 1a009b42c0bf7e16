#include "worker/optim/direction.h"

#include "common/status.h"

namespace cserps {

Direction::Direction(const v1::OptimizerConfig& config, size_t num_params)
    : kind_(config.momentum_kind() == v1::OptimizerConfig::MOMENTUM_UNSPECIFIED
                ? v1::OptimizerConfig::NONE
                : config.momentum_kind()),
      beta_(config.momentum()),
      weight_decay_(config.weight_decay()),
      num_params_(num_params) {
  CSERPS_CHECK(kind_ == v1::OptimizerConfig::NONE ||
               kind_ == v1::OptimizerConfig::HEAVY_BALL ||
               kind_ == v1::OptimizerConfig::NESTEROV);
  if (kind_ != v1::OptimizerConfig::NONE) momentum_.assign(num_params, 0.0f);
}

void Direction::Compute(absl::Span<const float> grad,
                        absl::Span<const float> params,
                        absl::Span<float> direction) {
  CSERPS_CHECK(grad.size() == num_params_ && params.size() == num_params_ &&
               direction.size() == num_params_);
  const float lambda = weight_decay_;
  const float beta = beta_;
  float* m = momentum_.data();
  switch (kind_) {
    case v1::OptimizerConfig::HEAVY_BALL:
      for (size_t i = 0; i < num_params_; ++i) {
        m[i] = beta * m[i] + (grad[i] + lambda * params[i]);
        direction[i] = m[i];
      }
      break;
    case v1::OptimizerConfig::NESTEROV:
      for (size_t i = 0; i < num_params_; ++i) {
        const float d = grad[i] + lambda * params[i];
        m[i] = beta * m[i] + d;
        direction[i] = d + beta * m[i];
      }
      break;
    default:
      for (size_t i = 0; i < num_params_; ++i) {
        direction[i] = grad[i] + lambda * params[i];
      }
      break;
  }
}

}  // namespace cserps
