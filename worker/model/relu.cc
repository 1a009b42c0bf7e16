#include "worker/model/relu.h"

#include "common/status.h"

namespace cserps {

void ReluInPlace(absl::Span<float> a) {
  for (float& v : a) v = v > 0.0f ? v : 0.0f;
}

void ReluBackwardInPlace(absl::Span<const float> activation,
                         absl::Span<float> grad) {
  CSERPS_CHECK(activation.size() == grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    if (!(activation[i] > 0.0f)) grad[i] = 0.0f;
  }
}

}  // namespace cserps
