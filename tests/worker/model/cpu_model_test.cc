#include "worker/model/cpu_model.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
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
  for (const ConvLayerSpec& conv : model.spec().convs) {
    for (size_t j = 0; j < conv.out_channels; ++j) {
      params[conv.bias_offset + j] = 0.4f * rng.UniformFloat() - 0.2f;
    }
  }
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
  // Over hidden units, and for conv stages over each pooling window's
  // largest pre-activation (the one whose sign decides the ReLU).
  double min_abs_preactivation = INFINITY;
  // Over pooling windows: largest pre-activation minus the runner-up.
  double min_pool_gap = INFINITY;
  double min_top1_margin = INFINITY;  // top logit minus runner-up
  std::vector<size_t> argmax;
};

// One conv stage on one image as the model defines it: 'same' convolution
// (cross-correlation) plus bias, ReLU, then 2x2 max-pool with stride 2.
std::vector<double> ReferenceConvStage(const ConvLayerSpec& c,
                                       const std::vector<double>& p,
                                       const std::vector<double>& a,
                                       Reference* ref) {
  const long h = static_cast<long>(c.height), w = static_cast<long>(c.width);
  const long k = static_cast<long>(c.kernel), pad = k / 2;
  const long in_c = static_cast<long>(c.in_channels);
  std::vector<double> z(c.conv_output_size());
  for (long o = 0; o < static_cast<long>(c.out_channels); ++o) {
    for (long y = 0; y < h; ++y) {
      for (long x = 0; x < w; ++x) {
        double sum = p[c.bias_offset + o];
        for (long i = 0; i < in_c; ++i) {
          for (long ky = 0; ky < k; ++ky) {
            for (long kx = 0; kx < k; ++kx) {
              const long iy = y + ky - pad, ix = x + kx - pad;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              sum += p[c.weight_offset + ((o * in_c + i) * k + ky) * k + kx] *
                     a[(i * h + iy) * w + ix];
            }
          }
        }
        z[(o * h + y) * w + x] = sum;
      }
    }
  }
  std::vector<double> out(c.output_size());
  const long ph = static_cast<long>(c.pooled_height);
  const long pw = static_cast<long>(c.pooled_width);
  for (long o = 0; o < static_cast<long>(c.out_channels); ++o) {
    for (long py = 0; py < ph; ++py) {
      for (long px = 0; px < pw; ++px) {
        std::vector<double> window;
        for (long dy = 0; dy < 2; ++dy) {
          for (long dx = 0; dx < 2; ++dx) {
            window.push_back(z[(o * h + 2 * py + dy) * w + 2 * px + dx]);
          }
        }
        std::sort(window.begin(), window.end());
        ref->min_abs_preactivation =
            std::min(ref->min_abs_preactivation, std::fabs(window[3]));
        ref->min_pool_gap = std::min(ref->min_pool_gap, window[3] - window[2]);
        double pooled = 0;  // max of the ReLU outputs
        for (double v : window) pooled = std::max(pooled, std::max(v, 0.0));
        out[(o * ph + py) * pw + px] = pooled;
      }
    }
  }
  return out;
}

Reference RunReference(const ModelSpec& spec, const std::vector<double>& p,
                       const Batch& batch) {
  Reference ref;
  for (size_t r = 0; r < batch.size; ++r) {
    std::vector<double> a(batch.features.begin() + r * batch.dim,
                          batch.features.begin() + (r + 1) * batch.dim);
    for (const ConvLayerSpec& conv : spec.convs) {
      a = ReferenceConvStage(conv, p, a, &ref);
    }
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
// magnitude. The kinks of ReLU and max-pooling are kept out of reach: no
// hidden pre-activation lies within `min_margin` (1e-3) of zero and no
// pooling window's two largest values within it of each other, far more
// than a step of h can move them.
//
// CNNs have many more pooling windows and pre-activations, so a margin of
// 1e-3 would be missed by chance; they use h = 1e-6 (rounding now ~1e-10)
// and a margin of 1e-4: a step of h in one parameter moves any
// pre-activation by at most h times the sum of |inputs x weights| it passes
// through, well under 1e-5 here.
void ExpectMatchesReference(Model& model, const std::vector<float>& params,
                            const Batch& batch, double h = 1e-5,
                            double min_margin = 1e-3) {
  const ModelSpec& spec = model.spec();
  std::vector<float> grad(spec.num_params, 1234.0f);
  const float loss = model.LossAndGradient(params, batch, absl::MakeSpan(grad)).value();

  std::vector<double> p(params.begin(), params.end());
  const Reference base = RunReference(spec, p, batch);
  ASSERT_GT(base.min_abs_preactivation, min_margin);
  ASSERT_GT(base.min_pool_gap, min_margin);
  EXPECT_NEAR(loss, base.loss_sum / batch.size, 1e-5 * base.loss_sum);

  const double kH = h;
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

TEST(CpuModelTest, FlatModelIsRefused) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::FLAT);
  config.set_num_params(100);
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("FLAT model is computed by the front"),
            std::string::npos)
      << model.status();
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
  EXPECT_EQ(model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value(),
            0.0f);
  EXPECT_TRUE(std::all_of(grad.begin(), grad.end(),
                          [](float g) { return g == 0.0f; }));
  const EvalSums sums = model->Evaluate(params, batch.View()).value();
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

  const EvalSums sums = model->Evaluate(params, batch.View()).value();
  EXPECT_EQ(sums.count, 40u);
  EXPECT_EQ(sums.correct, 20u);
  EXPECT_NEAR(sums.loss_sum, ref.loss_sum, 1e-5 * ref.loss_sum);

  // The loss it reports is the one training minimises.
  std::vector<float> grad(params.size());
  const float mean =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value();
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
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value();
  for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.05f * grad[i];
  const float after =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value();
  EXPECT_LT(after, before);
}

// The layouts servers and checkpoints depend on, computed by hand
// (docs/protocol.md, Section 5): a CNN field in the proto changes nothing.
TEST(CpuModelTest, SoftmaxAndMlpLayoutsUnchanged) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::MLP);
  config.add_hidden(256);
  absl::StatusOr<ModelSpec> mlp = MakeModelSpec(config);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_TRUE(mlp->convs.empty());
  ASSERT_EQ(mlp->layers.size(), 2u);
  EXPECT_EQ(mlp->layers[0].weight_offset, 0u);
  EXPECT_EQ(mlp->layers[0].bias_offset, 200704u);  // 256 * 784
  EXPECT_EQ(mlp->layers[1].weight_offset, 200960u);
  EXPECT_EQ(mlp->layers[1].bias_offset, 203520u);  // + 10 * 256
  EXPECT_EQ(mlp->num_params, 203530u);

  config.set_kind(v1::ModelConfig::SOFTMAX);
  config.clear_hidden();
  absl::StatusOr<ModelSpec> softmax = MakeModelSpec(config);
  ASSERT_TRUE(softmax.ok()) << softmax.status();
  EXPECT_TRUE(softmax->convs.empty());
  ASSERT_EQ(softmax->layers.size(), 1u);
  EXPECT_EQ(softmax->layers[0].bias_offset, 7840u);
  EXPECT_EQ(softmax->num_params, 7850u);
}

// A 2-channel 7 x 6 image, stages of 3 and 4 channels with 3x3 kernels, 3
// classes: 7 x 6 pools to 3 x 3 (odd row dropped), then to 1 x 1.
v1::ModelConfig TinyCnnConfig() {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::CNN);
  config.add_conv_channels(3);
  config.add_conv_channels(4);
  config.set_kernel_size(3);
  config.set_image_height(7);
  config.set_image_width(6);
  config.set_image_channels(2);
  config.set_input_dim(84);
  config.set_num_classes(3);
  return config;
}

std::unique_ptr<Model> MakeCnn(const v1::ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

TEST(CpuModelTest, CnnLayoutFollowsConfig) {
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(TinyCnnConfig());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->input_dim, 84u);
  ASSERT_EQ(spec->convs.size(), 2u);
  const ConvLayerSpec& c0 = spec->convs[0];
  EXPECT_EQ(c0.in_channels, 2u);
  EXPECT_EQ(c0.out_channels, 3u);
  EXPECT_EQ(c0.kernel, 3u);
  EXPECT_EQ(c0.height, 7u);
  EXPECT_EQ(c0.width, 6u);
  EXPECT_EQ(c0.pooled_height, 3u);
  EXPECT_EQ(c0.pooled_width, 3u);
  EXPECT_EQ(c0.weight_offset, 0u);
  EXPECT_EQ(c0.bias_offset, 54u);  // 3 * 2 * 3 * 3
  const ConvLayerSpec& c1 = spec->convs[1];
  EXPECT_EQ(c1.in_channels, 3u);
  EXPECT_EQ(c1.out_channels, 4u);
  EXPECT_EQ(c1.height, 3u);
  EXPECT_EQ(c1.width, 3u);
  EXPECT_EQ(c1.pooled_height, 1u);
  EXPECT_EQ(c1.pooled_width, 1u);
  EXPECT_EQ(c1.weight_offset, 57u);
  EXPECT_EQ(c1.bias_offset, 165u);  // + 4 * 3 * 3 * 3
  ASSERT_EQ(spec->layers.size(), 1u);
  EXPECT_EQ(spec->layers[0].in, 4u);  // 4 channels x 1 x 1
  EXPECT_EQ(spec->layers[0].out, 3u);
  EXPECT_EQ(spec->layers[0].weight_offset, 169u);
  EXPECT_EQ(spec->layers[0].bias_offset, 181u);
  EXPECT_EQ(spec->num_params, 184u);

  // Every default: 28 x 28 x 1, [16, 32], 5 x 5, 10 classes.
  v1::ModelConfig defaults;
  defaults.set_kind(v1::ModelConfig::CNN);
  absl::StatusOr<ModelSpec> full = MakeModelSpec(defaults);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->input_dim, 784u);
  ASSERT_EQ(full->convs.size(), 2u);
  EXPECT_EQ(full->convs[1].bias_offset, 416u + 12800u);  // 16*25+16, 32*16*25
  EXPECT_EQ(full->layers[0].in, 32u * 7 * 7);
  EXPECT_EQ(full->num_params, 416u + 12832u + 15690u);
}

TEST(CpuModelTest, CnnConfigErrorsNameTheField) {
  struct Case {
    const char* name;
    void (*mutate)(v1::ModelConfig*);
    const char* message_start;
  };
  const Case cases[] = {
      {"zero channels",
       [](v1::ModelConfig* c) { c->set_conv_channels(1, 0); },
       "model.conv_channels[1]: must be > 0"},
      {"even kernel", [](v1::ModelConfig* c) { c->set_kernel_size(4); },
       "model.kernel_size: must be odd"},
      {"input_dim not the image size",
       [](v1::ModelConfig* c) { c->set_input_dim(100); },
       "model.input_dim: 100 != image_height * image_width * image_channels "
       "= 84 (7 * 6 * 2)"},
      {"hidden layers", [](v1::ModelConfig* c) { c->add_hidden(8); },
       "model.hidden: must be empty for a CNN"},
      {"too many stages",
       [](v1::ModelConfig* c) { c->add_conv_channels(5); },
       "model.conv_channels: 3 stages are too many for a 7 x 6 image"},
      {"image size overflows",
       [](v1::ModelConfig* c) {
         c->set_image_height(4000000000u);
         c->set_image_width(4000000000u);
         c->set_image_channels(4000000000u);
       },
       "model.image_channels: "},
      {"MLP with a kernel",
       [](v1::ModelConfig* c) {
         c->set_kind(v1::ModelConfig::MLP);
         c->add_hidden(8);
         c->clear_conv_channels();
         c->clear_image_height();
         c->clear_image_width();
         c->clear_image_channels();
       },
       "model.kernel_size: only a CNN has it (kind is MLP)"},
      {"SOFTMAX with conv channels",
       [](v1::ModelConfig* c) { c->set_kind(v1::ModelConfig::SOFTMAX); },
       "model.conv_channels: only a CNN has it (kind is SOFTMAX)"},
  };
  for (const Case& c : cases) {
    v1::ModelConfig config = TinyCnnConfig();
    c.mutate(&config);
    absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
    ASSERT_FALSE(model.ok()) << c.name;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name;
    EXPECT_EQ(model.status().message().substr(0, strlen(c.message_start)),
              c.message_start)
        << c.name << ": " << model.status();
  }
}

// The job-config path: ApplyDefaults fills the CNN fields (and leaves an
// MLP's alone, so its fingerprint is what it was), and ValidateJobConfig
// reports the layout's errors by field.
TEST(CpuModelTest, JobConfigDefaultsAndValidatesCnn) {
  v1::JobConfig job;
  job.mutable_cluster()->add_servers("127.0.0.1:5000");
  job.mutable_cluster()->set_num_workers(1);
  job.mutable_data()->set_batch_size(8);
  job.mutable_optimizer()->set_lr(0.1f);
  job.set_epochs(1);

  v1::JobConfig mlp = job;
  mlp.mutable_model()->set_kind(v1::ModelConfig::MLP);
  mlp.mutable_model()->add_hidden(16);
  ApplyDefaults(&mlp);
  EXPECT_EQ(mlp.model().conv_channels_size(), 0);
  EXPECT_EQ(mlp.model().kernel_size(), 0u);
  EXPECT_EQ(mlp.model().image_height(), 0u);
  EXPECT_TRUE(ValidateJobConfig(mlp).ok());

  v1::JobConfig cnn = job;
  cnn.mutable_model()->set_kind(v1::ModelConfig::CNN);
  ApplyDefaults(&cnn);
  ASSERT_EQ(cnn.model().conv_channels_size(), 2);
  EXPECT_EQ(cnn.model().conv_channels(0), 16u);
  EXPECT_EQ(cnn.model().conv_channels(1), 32u);
  EXPECT_EQ(cnn.model().kernel_size(), 5u);
  EXPECT_EQ(cnn.model().image_height(), 28u);
  EXPECT_EQ(cnn.model().image_width(), 28u);
  EXPECT_EQ(cnn.model().image_channels(), 1u);
  EXPECT_EQ(cnn.model().input_dim(), 784u);
  EXPECT_EQ(cnn.model().num_classes(), 10u);
  EXPECT_TRUE(ValidateJobConfig(cnn).ok()) << ValidateJobConfig(cnn);

  // input_dim follows the image when unset.
  v1::JobConfig color = job;
  color.mutable_model()->set_kind(v1::ModelConfig::CNN);
  color.mutable_model()->set_image_height(32);
  color.mutable_model()->set_image_width(32);
  color.mutable_model()->set_image_channels(3);
  ApplyDefaults(&color);
  EXPECT_EQ(color.model().input_dim(), 3072u);
  EXPECT_TRUE(ValidateJobConfig(color).ok()) << ValidateJobConfig(color);

  cnn.mutable_model()->set_conv_channels(1, 0);
  const absl::Status zero = ValidateJobConfig(cnn);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.message().substr(0, 23), "model.conv_channels[1]:") << zero;

  mlp.mutable_model()->set_kernel_size(3);
  const absl::Status stray = ValidateJobConfig(mlp);
  EXPECT_EQ(stray.message().substr(0, 18), "model.kernel_size:") << stray;
}

TEST(CpuModelTest, CnnGradientMatchesFiniteDifferences) {
  std::unique_ptr<Model> model = MakeCnn(TinyCnnConfig());
  const OwnedBatch batch = RandomBatch(21, 5, 84, 3);
  ExpectMatchesReference(*model, TestParams(*model, 21), batch.View(), 1e-6,
                         1e-4);
}

// 34 images span several conv groups of CpuModel::kConvGroupImages, the
// last one partial; a small batch in between must not see the large batch's
// leftovers.
TEST(CpuModelTest, CnnGroupsAndScratchReuse) {
  static_assert(CpuModel::kConvGroupImages < 34 &&
                34 % CpuModel::kConvGroupImages != 0);
  std::unique_ptr<Model> model = MakeCnn(TinyCnnConfig());
  const std::vector<float> params = TestParams(*model, 22);
  const OwnedBatch batch = RandomBatch(22, 34, 84, 3);
  ExpectMatchesReference(*model, params, batch.View(), 1e-6, 1e-4);
  ExpectMatchesReference(*model, params, batch.View(3), 1e-6, 1e-4);
  ExpectMatchesReference(*model, params, batch.View(), 1e-6, 1e-4);
}

TEST(CpuModelTest, CnnEvaluateMatchesReference) {
  std::unique_ptr<Model> model = MakeCnn(TinyCnnConfig());
  const std::vector<float> params = TestParams(*model, 23);
  OwnedBatch batch = RandomBatch(23, 40, 84, 3);
  const std::vector<double> p(params.begin(), params.end());
  const Reference unlabeled = RunReference(model->spec(), p, batch.View());
  ASSERT_GT(unlabeled.min_top1_margin, 1e-4);
  for (size_t r = 0; r < 40; ++r) {
    batch.labels[r] = static_cast<uint8_t>(
        r % 4 == 0 ? unlabeled.argmax[r] : (unlabeled.argmax[r] + 1) % 3);
  }
  const Reference ref = RunReference(model->spec(), p, batch.View());
  ASSERT_EQ(ref.correct, 10u);
  const EvalSums sums = model->Evaluate(params, batch.View()).value();
  EXPECT_EQ(sums.count, 40u);
  EXPECT_EQ(sums.correct, 10u);
  EXPECT_NEAR(sums.loss_sum, ref.loss_sum, 1e-5 * ref.loss_sum);
}

// Plain SGD from the documented initialisation fits a small batch of random
// images and labels: the loss falls well below its start (ln 4 ~ 1.39 for
// a fresh 4-class model).
TEST(CpuModelTest, CnnSgdStepsReduceLoss) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::CNN);
  config.add_conv_channels(4);
  config.add_conv_channels(8);
  config.set_kernel_size(3);
  config.set_image_height(12);
  config.set_image_width(12);
  config.set_num_classes(4);
  std::unique_ptr<Model> model = MakeCnn(config);
  std::vector<float> params(model->spec().num_params);
  model->Initialize(31, absl::MakeSpan(params));
  const OwnedBatch batch = RandomBatch(31, 16, 144, 4);
  std::vector<float> grad(params.size());
  const float first =
      model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value();
  float loss = first;
  for (int step = 0; step < 40; ++step) {
    for (size_t i = 0; i < params.size(); ++i) params[i] -= 0.1f * grad[i];
    loss = model->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)).value();
  }
  EXPECT_LT(loss, 0.25f * first) << "first " << first;
}

}  // namespace
}  // namespace cserps
