#include "common/direction.h"

#include "common/status.h"
#include "common/vector_clones.h"

namespace cserps {

DirectionRule MakeDirectionRule(const v1::OptimizerConfig& config) {
  DirectionRule rule;
  rule.kind = config.momentum_kind() == v1::OptimizerConfig::MOMENTUM_UNSPECIFIED
                  ? v1::OptimizerConfig::NONE
                  : config.momentum_kind();
  rule.beta = config.momentum();
  rule.weight_decay = config.weight_decay();
  return rule;
}

CSERPS_VECTOR_CLONES
void ComputeDirection(const DirectionRule& rule, size_t n, const float* grad,
                      const float* params, float* momentum, float* direction) {
  const float lambda = rule.weight_decay;
  const float beta = rule.beta;
  float* m = momentum;
  switch (rule.kind) {
    case v1::OptimizerConfig::HEAVY_BALL:
      for (size_t i = 0; i < n; ++i) {
        m[i] = beta * m[i] + (grad[i] + lambda * params[i]);
        direction[i] = m[i];
      }
      break;
    case v1::OptimizerConfig::NESTEROV:
      for (size_t i = 0; i < n; ++i) {
        const float d = grad[i] + lambda * params[i];
        m[i] = beta * m[i] + d;
        direction[i] = d + beta * m[i];
      }
      break;
    case v1::OptimizerConfig::NONE:
      for (size_t i = 0; i < n; ++i) {
        direction[i] = grad[i] + lambda * params[i];
      }
      break;
    default:
      CSERPS_CHECK(false && "unknown momentum kind");
  }
}

CSERPS_VECTOR_CLONES
void Descend(float lr, size_t n, const float* p, float* x) {
  for (size_t i = 0; i < n; ++i) x[i] -= lr * p[i];
}

CSERPS_VECTOR_CLONES
void ApplySharedMomentum(const DirectionRule& rule, size_t n, const float* u, float* momentum,
                         float* x) {
  const float beta = rule.beta;
  float* m = momentum;
  switch (rule.kind) {
    case v1::OptimizerConfig::HEAVY_BALL:
      for (size_t i = 0; i < n; ++i) {
        m[i] = beta * m[i] + u[i];
        x[i] -= m[i];
      }
      break;
    case v1::OptimizerConfig::NESTEROV:
      for (size_t i = 0; i < n; ++i) {
        m[i] = beta * m[i] + u[i];
        x[i] -= u[i] + beta * m[i];
      }
      break;
    default:
      CSERPS_CHECK(false && "ApplySharedMomentum: the rule has no momentum");
  }
}

}  // namespace cserps
