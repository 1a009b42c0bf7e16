#include "worker/model/initialize.h"

#include <algorithm>
#include <cmath>

#include "common/prng.h"
#include "common/status.h"

namespace cserps {
namespace {

// Fills `weights` from tensor `tensor`'s stream (initialize.h).
void FillUniform(uint64_t init_key, size_t tensor, double bound,
                 float* weights, size_t count) {
  CounterRng rng(DeriveKey(init_key, tensor));
  for (size_t i = 0; i < count; ++i) {
    const double u = rng.UniformFloat();
    weights[i] = static_cast<float>(bound * (2.0 * u - 1.0));
  }
}

}  // namespace

double InitWeightBound(const ModelSpec& spec, size_t layer) {
  CSERPS_CHECK(layer < spec.layers.size());
  const bool is_output = layer + 1 == spec.layers.size();
  const double gain = is_output ? 3.0 : 6.0;
  return std::sqrt(gain / static_cast<double>(spec.layers[layer].in));
}

double ConvInitWeightBound(const ModelSpec& spec, size_t stage) {
  CSERPS_CHECK(stage < spec.convs.size());
  const ConvLayerSpec& conv = spec.convs[stage];
  return std::sqrt(6.0 / static_cast<double>(conv.in_channels * conv.kernel *
                                             conv.kernel));
}

void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params) {
  CSERPS_CHECK(params.size() == spec.num_params);
  const uint64_t init_key = DeriveKey(seed, kModelInitLabel);
  for (size_t c = 0; c < spec.convs.size(); ++c) {
    const ConvLayerSpec& conv = spec.convs[c];
    FillUniform(init_key, c, ConvInitWeightBound(spec, c),
                params.data() + conv.weight_offset, conv.weight_size());
    float* b = params.data() + conv.bias_offset;
    std::fill(b, b + conv.out_channels, 0.0f);
  }
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LinearLayerSpec& layer = spec.layers[l];
    FillUniform(init_key, spec.convs.size() + l, InitWeightBound(spec, l),
                params.data() + layer.weight_offset, layer.out * layer.in);
    float* b = params.data() + layer.bias_offset;
    std::fill(b, b + layer.out, 0.0f);
  }
}

}  // namespace cserps
