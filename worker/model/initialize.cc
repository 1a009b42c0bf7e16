#include "worker/model/initialize.h"

#include <algorithm>
#include <cmath>

#include "common/prng.h"
#include "common/status.h"

namespace cserps {

double InitWeightBound(const ModelSpec& spec, size_t layer) {
  CSERPS_CHECK(layer < spec.layers.size());
  const bool is_output = layer + 1 == spec.layers.size();
  const double gain = is_output ? 3.0 : 6.0;
  return std::sqrt(gain / static_cast<double>(spec.layers[layer].in));
}

void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params) {
  CSERPS_CHECK(params.size() == spec.num_params);
  const uint64_t init_key = DeriveKey(seed, kModelInitLabel);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LinearLayerSpec& layer = spec.layers[l];
    const double bound = InitWeightBound(spec, l);
    CounterRng rng(DeriveKey(init_key, l));
    float* w = params.data() + layer.weight_offset;
    for (size_t i = 0; i < layer.out * layer.in; ++i) {
      const double u = rng.UniformFloat();
      w[i] = static_cast<float>(bound * (2.0 * u - 1.0));
    }
    float* b = params.data() + layer.bias_offset;
    std::fill(b, b + layer.out, 0.0f);
  }
}

}  // namespace cserps
