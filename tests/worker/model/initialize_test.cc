#include "worker/model/initialize.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/model_spec.h"
#include "common/prng.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"

namespace cserps {
namespace {

// 50 -> 40 -> 10: enough weights per layer for spread checks.
ModelSpec TestSpec() {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::MLP);
  config.add_hidden(40);
  config.set_input_dim(50);
  config.set_num_classes(10);
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(config);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<float> Init(const ModelSpec& spec, uint64_t seed) {
  std::vector<float> params(spec.num_params,
                            std::numeric_limits<float>::quiet_NaN());
  InitializeParameters(spec, seed, absl::MakeSpan(params));
  return params;
}

TEST(InitializeTest, BoundsAreHeForHiddenAndLeCunForOutput) {
  const ModelSpec spec = TestSpec();
  EXPECT_DOUBLE_EQ(InitWeightBound(spec, 0), std::sqrt(6.0 / 50));
  EXPECT_DOUBLE_EQ(InitWeightBound(spec, 1), std::sqrt(3.0 / 40));
}

TEST(InitializeTest, DeterministicPerSeedAndDifferentAcrossSeeds) {
  const ModelSpec spec = TestSpec();
  const std::vector<float> a = Init(spec, 7);
  const std::vector<float> b = Init(spec, 7);
  const std::vector<float> c = Init(spec, 8);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  size_t differ = 0, weights = 0;
  for (const LinearLayerSpec& layer : spec.layers) {
    weights += layer.out * layer.in;
    for (size_t i = 0; i < layer.out * layer.in; ++i) {
      differ += a[layer.weight_offset + i] != c[layer.weight_offset + i];
    }
  }
  // A 24-bit uniform repeats by chance with probability 2^-24 per weight.
  EXPECT_GE(differ, weights - 2);
}

TEST(InitializeTest, BiasesZeroWeightsUniformWithinBound) {
  const ModelSpec spec = TestSpec();
  const std::vector<float> params = Init(spec, 123);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LinearLayerSpec& layer = spec.layers[l];
    for (size_t j = 0; j < layer.out; ++j) {
      EXPECT_EQ(params[layer.bias_offset + j], 0.0f) << "layer " << l;
    }
    const float bound = static_cast<float>(InitWeightBound(spec, l));
    const size_t n = layer.out * layer.in;
    double abs_sum = 0, sum = 0;
    float lo = bound, hi = -bound;
    for (size_t i = 0; i < n; ++i) {
      const float w = params[layer.weight_offset + i];
      ASSERT_LE(std::fabs(w), bound) << "layer " << l << " weight " << i;
      abs_sum += std::fabs(w);
      sum += w;
      lo = std::min(lo, w);
      hi = std::max(hi, w);
    }
    // U(-B, B): E|w| = B/2, E w = 0, sd(w) = B/sqrt(3); with n >= 400 the
    // sample means are within a few percent of B, and the extremes near ±B.
    EXPECT_NEAR(abs_sum / n, bound / 2, 0.1 * bound) << "layer " << l;
    EXPECT_NEAR(sum / n, 0.0, 0.15 * bound) << "layer " << l;
    EXPECT_LT(lo, -0.9f * bound) << "layer " << l;
    EXPECT_GT(hi, 0.9f * bound) << "layer " << l;
  }
}

// The documented streams (initialize.h), which a GPU backend must reproduce.
TEST(InitializeTest, FollowsDocumentedStreams) {
  const ModelSpec spec = TestSpec();
  const uint64_t seed = 2024;
  const std::vector<float> params = Init(spec, seed);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LinearLayerSpec& layer = spec.layers[l];
    const double bound =
        std::sqrt((l + 1 == spec.layers.size() ? 3.0 : 6.0) / layer.in);
    CounterRng rng(DeriveKey(DeriveKey(seed, kModelInitLabel), l));
    for (size_t i = 0; i < layer.out * layer.in; ++i) {
      const double u = static_cast<double>(rng.Next() >> 40) / (1 << 24);
      const float expected = static_cast<float>(bound * (2.0 * u - 1.0));
      ASSERT_EQ(params[layer.weight_offset + i], expected)
          << "layer " << l << " weight " << i;
    }
  }
}

TEST(InitializeTest, ModelInitializeUsesTheSameStreams) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::SOFTMAX);
  config.set_input_dim(9);
  config.set_num_classes(4);
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> via_model((*model)->spec().num_params, 1.0f);
  (*model)->Initialize(5, absl::MakeSpan(via_model));
  EXPECT_EQ(via_model, Init((*model)->spec(), 5));
}

// A CNN numbers its tensors conv stages first, then linear layers
// (initialize.h): stage c draws from stream c with bound sqrt(6 / (in * k^2)),
// the output layer from stream convs.size() with sqrt(3 / in).
TEST(InitializeTest, CnnFollowsDocumentedStreams) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::CNN);
  config.add_conv_channels(6);
  config.add_conv_channels(5);
  config.set_kernel_size(3);
  config.set_image_height(8);
  config.set_image_width(8);
  config.set_image_channels(2);
  config.set_num_classes(4);
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(ConvInitWeightBound(*spec, 0), std::sqrt(6.0 / 18));
  EXPECT_DOUBLE_EQ(ConvInitWeightBound(*spec, 1), std::sqrt(6.0 / 54));
  EXPECT_DOUBLE_EQ(InitWeightBound(*spec, 0), std::sqrt(3.0 / 20));  // 5*2*2

  const uint64_t seed = 77;
  const std::vector<float> params = Init(*spec, seed);
  const uint64_t init_key = DeriveKey(seed, kModelInitLabel);
  auto expect_stream = [&](uint64_t stream, double bound, size_t offset,
                           size_t count) {
    CounterRng rng(DeriveKey(init_key, stream));
    for (size_t i = 0; i < count; ++i) {
      const double u = static_cast<double>(rng.Next() >> 40) / (1 << 24);
      ASSERT_EQ(params[offset + i], static_cast<float>(bound * (2.0 * u - 1.0)))
          << "stream " << stream << " weight " << i;
    }
  };
  expect_stream(0, std::sqrt(6.0 / 18), spec->convs[0].weight_offset,
                6 * 2 * 3 * 3);
  expect_stream(1, std::sqrt(6.0 / 54), spec->convs[1].weight_offset,
                5 * 6 * 3 * 3);
  expect_stream(2, std::sqrt(3.0 / 20), spec->layers[0].weight_offset, 4 * 20);
  for (const ConvLayerSpec& conv : spec->convs) {
    for (size_t j = 0; j < conv.out_channels; ++j) {
      EXPECT_EQ(params[conv.bias_offset + j], 0.0f);
    }
  }
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(params[spec->layers[0].bias_offset + j], 0.0f);
  }
}

}  // namespace
}  // namespace cserps
