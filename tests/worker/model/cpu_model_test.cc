#include "worker/model/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"

namespace cserps {
namespace {

// A batch together with the storage it views.
struct OwnedBatch {
  std::vector<float> features;
  std::vector<uint8_t> labels;
  size_t dim = 0;

  Batch View(size_t rows) const {
    return Batch{absl::MakeConstSpan(features.data(), rows * dim),
                 absl::MakeConstSpan(labels.data(), rows), rows, dim};
  }
  Batch View() const { return View(labels.size()); }
};

OwnedBatch RandomBatch(uint64_t key, size_t rows, size_t dim, size_t classes) {
  CounterRng rng(key);
  OwnedBatch b;
  b.dim = dim;
  b.features.resize(rows * dim);
  for (float& x : b.features) x = 2.0f * rng.UniformFloat() - 1.0f;
  b.labels.resize(rows);
  for (uint8_t& y : b.labels) y = static_cast<uint8_t>(rng.Below(classes));
  return b;
}

std::unique_ptr<Model> MakeModel(v1::ModelConfig::Kind kind,
                                 std::vector<uint32_t> hidden) {
  v1::ModelConfig config;
  config.set_kind(kind);
  for (uint32_t h : hidden) config.add_hidden(h);
  config.set_input_dim(7);
  config.set_num_classes(3);
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

// Initialised weights plus random non-zero biases, so that every bias path
// is exercised in the forward pass too.
std::vector<float> TestParams(const Model& model, uint64_t seed) {
  std::vector<float> params(model.spec().num_params);
  model.Initialize(seed, absl::MakeSpan(params));
  CounterRng rng(DeriveKey(seed, 99));
  for (const LinearLayerSpec& layer : model.spec().layers) {
    for (size_t j = 0; j < layer.out; ++j) {
      params[layer.bias_offset + j] = 0.4f * rng.UniformFloat() - 0.2f;
    }
  }
  return params;
}

// The model in double precision with plain loops, independent of the sgemm
// code and of the layer helpers.
struct Reference {
  double loss_sum = 0;
  size_t correct = 0;
  double min_abs_preactivation = INFINITY;  // over hidden units
  double min_top1_margin = INFINITY;        // top logit minus runner-up
  std::vector<size_t> argmax;
};

Reference RunReference(const ModelSpec& spec, const std::vector<double>& p,
                       const Batch& batch) {
  Reference ref;
  for (size_t r = 0; r < batch.size; ++r) {
    std::vector<double> a(batch.features.begin() + r * batch.dim,
                          batch.features.begin() + (r + 1) * batch.dim);
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      const LinearLayerSpec& layer = spec.layers[l];
      std::vector<double> z(layer.out);
      for (size_t j = 0; j < layer.out; ++j) {
        z[j] = p[layer.bias_offset + j];
        for (size_t k = 0; k < layer.in; ++k) {
          z[j] += p[layer.weight_offset + j * layer.in + k] * a[k];
        }
        if (l + 1 < spec.layers.size()) {
          ref.min_abs_preactivation =
              std::min(ref.min_abs_preactivation, std::fabs(z[j]));
          z[j] = std::max(z[j], 0.0);
        }
      }
      a = std::move(z);
    }
    const double m = *std::max_element(a.begin(), a.end());
    double s = 0;
    for (double z : a) s += std::exp(z - m);
    ref.loss_sum += m + std::log(s) - a[batch.labels[r]];
    const size_t best = std::max_element(a.begin(), a.end()) - a.begin();
    double runner_up = -INFINITY;
    for (size_t j = 0; j < a.size(); ++j) {
      if (j != best) runner_up = std::max(runner_up, a[j]);
    }
    ref.min_top1_margin = std::min(ref.min_top1_margin, a[best] - runner_up);
    ref.argmax.push_back(best);
    ref.correct += best == batch.labels[r];
  }
  return ref;
}

// Checks LossAndGradient on `batch` against the double reference: the loss
// value, and every parameter's gradient against central differences of the
// reference's mean loss.
//
// Tolerance |analytic - numeric| <= 1e-5 + 1e-3 |numeric|: with h = 1e-5 the
// double differences are accurate to ~1e-9 (truncation h^2 and rounding
// 1e-16/h), while the float forward/backward carries ~1e-7 relative error on
// O(1) intermediates; gradient entries here are O(1e-2..1e-1), so a wrong
// term (missing mask, transpose, 1/rows) exceeds the bound by orders of
// magnitude. The kink of ReLU is kept out of reach: no hidden pre-activation
// lies within 1e-3 of zero, far more than a step of h can move it.
void ExpectMatchesReference(Model& model, const std::vector<float>& params,
                            const Batch& batch) {
  const ModelSpec& spec = model.spec();
  std::vector<float> grad(spec.num_params, 1234.0f);
  const float loss = model.LossAndGradient(params, batch, absl::MakeSpan(grad));

  std::vector<double> p(params.begin(), params.end());
  const Reference base = RunReference(spec, p, batch);
  ASSERT_GT(base.min_abs_preactivation, 1e-3);
  EXPECT_NEAR(loss, base.loss_sum / batch.size, 1e-5 * base.loss_sum);

  constexpr double kH = 1e-5;
  double max_abs_grad = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double saved = p[i];
    p[i] = saved + kH;
    const double up = RunReference(spec, p, batch).loss_sum / batch.size;
    p[i] = saved - kH;
    const double down = RunReference(spec, p, batch).loss_sum / batch.size;
    p[i] = saved;
    const double numeric = (up - down) / (2 * kH);
    max_abs_grad = std::max(max_abs_grad, std::fabs(numeric));
    EXPECT_NEAR(grad[i], numeric, 1e-5 + 1e-3 * std::fabs(numeric))
        << "param " << i << " of " << p.size();
  }
  // The absolute slack above is meaningless if the gradient is tiny.
  EXPECT_GT(max_abs_grad, 1e-2);
}

TEST(CpuModelTest, SpecFollowsConfig) {
  std::unique_ptr<Model> mlp = MakeModel(v1::ModelConfig::MLP, {5, 4});
  // 7*5+5 + 5*4+4 + 4*3+3
  EXPECT_EQ(mlp->spec().num_params, 79u);
  std::unique_ptr<Model> softmax = MakeModel(v1::ModelConfig::SOFTMAX, {});
  EXPECT_EQ(softmax->spec().num_params, 24u);
}

TEST(CpuModelTest, InvalidConfigNamesTheField) {
  v1::ModelConfig config;  // kind unspecified
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("model.kind"), std::string::npos);
}

TEST(CpuModelTest, SoftmaxGradientMatchesFiniteDifferences) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::SOFTMAX, {});
  const OwnedBatch batch = RandomBatch(11, 6, 7, 3);
  ExpectMatchesReference(*model, TestParams(*model, 1), batch.View());
}

TEST(CpuModelTest, MlpGradientMatchesFiniteDifferences) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::MLP, {5, 4});
  const OwnedBatch batch = RandomBatch(12, 6, 7, 3);
  ExpectMatchesReference(*model, TestParams(*model, 2), batch.View());
}

// Scratch buffers are reused across batch sizes: a smaller batch after a
// larger one, then the larger again, must each give the right answer.
TEST(CpuModelTest, ScratchReuseAcrossBatchSizes) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::MLP, {5, 4});
  const std::vector<float> params = TestParams(*model, 3);
  const OwnedBatch batch = RandomBatch(13, 6, 7, 3);
  const OwnedBatch other = RandomBatch(14, 6, 7, 3);
  ExpectMatchesReference(*model, params, batch.View());
  ExpectMatchesReference(*model, params, other.View(3));
  ExpectMatchesReference(*model, params, batch.View());
  ExpectMatchesReference(*model, params, other.View(1));
}

TEST(CpuModelTest, EmptyBatchGivesZeroLossAndGradient) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::MLP, {5, 4});
  const std::vector<float> params = TestParams(*model, 4);
  const OwnedBatch batch = RandomBatch(15, 0, 7, 3);
  std::vector<float> grad(params.size(), 1.0f);
  EXPECT_EQ(model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)),
            0.0f);
  EXPECT_TRUE(std::all_of(grad.begin(), grad.end(),
                          [](float g) { return g == 0.0f; }));
  const EvalSums sums = model->Evaluate(params, batch.View());
  EXPECT_EQ(sums.count, 0u);
  EXPECT_EQ(sums.correct, 0u);
  EXPECT_EQ(sums.loss_sum, 0.0);
}

// Evaluate on 40 examples whose labels are the reference's prediction for
// even rows and a different class for odd rows: exactly 20 correct.
TEST(CpuModelTest, EvaluateMatchesReference) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::MLP, {5, 4});
  const std::vector<float> params = TestParams(*model, 5);
  OwnedBatch batch = RandomBatch(16, 40, 7, 3);
  const std::vector<double> p(params.begin(), params.end());
  const Reference unlabeled = RunReference(model->spec(), p, batch.View());
  // float and double must agree on every argmax.
  ASSERT_GT(unlabeled.min_top1_margin, 1e-4);
  for (size_t r = 0; r < 40; ++r) {
    batch.labels[r] = static_cast<uint8_t>(
        r % 2 == 0 ? unlabeled.argmax[r] : (unlabeled.argmax[r] + 1) % 3);
  }
  const Reference ref = RunReference(model->spec(), p, batch.View());
  ASSERT_EQ(ref.correct, 20u);

  const EvalSums sums = model->Evaluate(params, batch.View());
  EXPECT_EQ(sums.count, 40u);
  EXPECT_EQ(sums.correct, 20u);
  EXPECT_NEAR(sums.loss_sum, ref.loss_sum, 1e-5 * ref.loss_sum);

  // The loss it reports is the one training minimises.
  std::vector<float> grad(params.size());
  const float mean =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad));
  EXPECT_NEAR(sums.loss_sum / 40, mean, 1e-6);
}

// One step along -grad lowers the loss: the gradient's sign is right as a
// whole, not only entry by entry.
TEST(CpuModelTest, GradientStepLowersLoss) {
  std::unique_ptr<Model> model = MakeModel(v1::ModelConfig::MLP, {5, 4});
  std::vector<float> params = TestParams(*model, 6);
  const OwnedBatch batch = RandomBatch(17, 6, 7, 3);
  std::vector<float> grad(params.size());
  const float before =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad));
  for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * grad[i];
  const float after =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad));
  EXPECT_LT(after, before);
}

}  // namespace
}  // namespace cserps
