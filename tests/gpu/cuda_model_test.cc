// The CUDA model against the CPU backend (worker/model/cpu_model.h) on random
// data: same loss, gradient and evaluation to float rounding.
#include "worker/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/prng.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/model/model.h"

namespace cserps {
namespace {

// Relative tolerance of the CPU/GPU agreement: both compute in float, with
// sums in different orders.
constexpr double kRelTol = 1e-4;
// Hidden pre-activations and top-1 margins of the test data stay further than
// this from zero, so that float rounding cannot flip a ReLU or a prediction
// between the backends (checked by DataStaysAwayFromTies, which needs no GPU).
constexpr double kMinDistance = 1e-5;

struct OwnedBatch {
  std::vector<float> features;
  std::vector<uint8_t> labels;
  size_t dim = 0;

  Batch View() const {
    return Batch{features, labels, labels.size(), dim};
  }
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

struct Case {
  std::string name;
  v1::ModelConfig::Kind kind;
  std::vector<uint32_t> hidden;
  uint32_t input_dim;
  uint32_t classes;
  size_t rows;
  uint64_t seed;
};

std::vector<Case> Cases() {
  return {
      {"softmax_small", v1::ModelConfig::SOFTMAX, {}, 7, 3, 33, 1},
      {"softmax_mnist", v1::ModelConfig::SOFTMAX, {}, 784, 10, 128, 2},
      // More classes than a warp has lanes, and labels up to 199.
      {"softmax_200_classes", v1::ModelConfig::SOFTMAX, {}, 20, 200, 9, 3},
      {"mlp_one_row", v1::ModelConfig::MLP, {5}, 37, 4, 1, 4},
      {"mlp_mnist", v1::ModelConfig::MLP, {64, 32}, 784, 10, 64, 5},
      {"mlp_40_classes", v1::ModelConfig::MLP, {40}, 50, 40, 17, 6},
  };
}

v1::ModelConfig ConfigOf(const Case& c) {
  v1::ModelConfig config;
  config.set_kind(c.kind);
  for (uint32_t h : c.hidden) config.add_hidden(h);
  config.set_input_dim(c.input_dim);
  config.set_num_classes(c.classes);
  return config;
}

// Initialised weights plus random non-zero biases, so that the bias paths
// matter in the forward pass too.
std::vector<float> TestParams(const ModelSpec& spec, const Model& model,
                              uint64_t seed) {
  std::vector<float> params(spec.num_params);
  model.Initialize(seed, absl::MakeSpan(params));
  CounterRng rng(DeriveKey(seed, 99));
  for (const LinearLayerSpec& layer : spec.layers) {
    for (size_t j = 0; j < layer.out; ++j) {
      params[layer.bias_offset + j] = 0.4f * rng.UniformFloat() - 0.2f;
    }
  }
  return params;
}

// The smallest |hidden pre-activation| and the smallest gap between a row's
// two largest logits, in double with plain loops.
struct Distances {
  double min_preactivation = INFINITY;
  double min_margin = INFINITY;
};

Distances ReferenceDistances(const ModelSpec& spec,
                             const std::vector<float>& params,
                             const OwnedBatch& batch) {
  Distances d;
  const size_t rows = batch.labels.size();
  for (size_t r = 0; r < rows; ++r) {
    std::vector<double> a(batch.features.begin() + r * batch.dim,
                          batch.features.begin() + (r + 1) * batch.dim);
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      const LinearLayerSpec& layer = spec.layers[l];
      std::vector<double> z(layer.out);
      for (size_t o = 0; o < layer.out; ++o) {
        double s = params[layer.bias_offset + o];
        for (size_t i = 0; i < layer.in; ++i) {
          s += static_cast<double>(params[layer.weight_offset + o * layer.in + i]) *
               a[i];
        }
        z[o] = s;
      }
      if (l + 1 < spec.layers.size()) {
        for (double& v : z) {
          d.min_preactivation = std::min(d.min_preactivation, std::fabs(v));
          v = v > 0 ? v : 0;
        }
      } else if (z.size() > 1) {
        std::vector<double> sorted = z;
        std::sort(sorted.rbegin(), sorted.rend());
        d.min_margin = std::min(d.min_margin, sorted[0] - sorted[1]);
      }
      a = std::move(z);
    }
  }
  return d;
}

// max |gpu - cpu| <= kRelTol * max |cpu| over one tensor.
void ExpectTensorNear(absl::Span<const float> cpu, absl::Span<const float> gpu,
                      const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  }
  EXPECT_LE(diff, kRelTol * scale + 1e-12) << what << " (max |cpu| " << scale << ")";
}

void ExpectGradientNear(const ModelSpec& spec, const std::vector<float>& cpu,
                        const std::vector<float>& gpu, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LinearLayerSpec& layer = spec.layers[l];
    const size_t w = layer.out * layer.in;
    ExpectTensorNear(absl::MakeConstSpan(cpu).subspan(layer.weight_offset, w),
                     absl::MakeConstSpan(gpu).subspan(layer.weight_offset, w),
                     what + ": dW of layer " + std::to_string(l));
    ExpectTensorNear(absl::MakeConstSpan(cpu).subspan(layer.bias_offset, layer.out),
                     absl::MakeConstSpan(gpu).subspan(layer.bias_offset, layer.out),
                     what + ": db of layer " + std::to_string(l));
  }
}

void ExpectRelNear(double cpu, double gpu, const std::string& what) {
  EXPECT_LE(std::fabs(gpu - cpu), kRelTol * std::fabs(cpu) + 1e-12)
      << what << ": cpu " << cpu << ", gpu " << gpu;
}

std::unique_ptr<Model> CpuModelOf(const v1::ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCpuModel(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// Loss, gradient and evaluation of both backends on one batch.
void ExpectAgreement(Model& cpu, CudaModel& gpu, const std::vector<float>& params,
                     const OwnedBatch& batch, const std::string& what) {
  const ModelSpec& spec = cpu.spec();
  std::vector<float> cpu_grad(spec.num_params), gpu_grad(spec.num_params, NAN);
  const float cpu_loss = cpu.LossAndGradient(params, batch.View(),
                                             absl::MakeSpan(cpu_grad));
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float gpu_loss,
      gpu.TryLossAndGradient(params, batch.View(), absl::MakeSpan(gpu_grad)));
  ExpectRelNear(cpu_loss, gpu_loss, what + ": loss");
  ExpectGradientNear(spec, cpu_grad, gpu_grad, what);

  const EvalSums cpu_eval = cpu.Evaluate(params, batch.View());
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums gpu_eval,
                              gpu.TryEvaluate(params, batch.View()));
  ExpectRelNear(cpu_eval.loss_sum, gpu_eval.loss_sum, what + ": loss_sum");
  EXPECT_EQ(cpu_eval.correct, gpu_eval.correct) << what;
  EXPECT_EQ(cpu_eval.count, gpu_eval.count) << what;
}

TEST(CudaModelConfigTest, RejectsWhatItCannotRunWithoutTouchingTheDevice) {
  v1::ModelConfig softmax_with_hidden;
  softmax_with_hidden.set_kind(v1::ModelConfig::SOFTMAX);
  softmax_with_hidden.add_hidden(4);
  absl::StatusOr<std::unique_ptr<Model>> model = MakeCudaModel(softmax_with_hidden);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(model.status().message(), "model.hidden"))
      << model.status();

  // Kind 3 is the CNN, which this backend does not run (yet): rejected
  // naming model.kind, whether or not the CPU side knows the kind.
  v1::ModelConfig cnn;
  cnn.set_kind(static_cast<v1::ModelConfig::Kind>(3));
  model = MakeCudaModel(cnn);
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::StartsWith(model.status().message(), "model.kind"))
      << model.status();
}

// The precondition of the agreement tests, on the host only.
TEST(CudaModelDataTest, DataStaysAwayFromTies) {
  for (const Case& c : Cases()) {
    const v1::ModelConfig config = ConfigOf(c);
    std::unique_ptr<Model> cpu = CpuModelOf(config);
    ASSERT_NE(cpu, nullptr);
    const std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
    const OwnedBatch batch =
        RandomBatch(DeriveKey(c.seed, 7), c.rows, c.input_dim, c.classes);
    const Distances d = ReferenceDistances(cpu->spec(), params, batch);
    EXPECT_GT(d.min_preactivation, kMinDistance) << c.name;
    EXPECT_GT(d.min_margin, kMinDistance) << c.name;
  }
}

TEST(CudaModelTest, InitializeEqualsCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    const v1::ModelConfig config = ConfigOf(c);
    std::unique_ptr<Model> cpu = CpuModelOf(config);
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                                CudaModel::Create(config));
    ASSERT_EQ(gpu->spec().num_params, cpu->spec().num_params);
    std::vector<float> a(cpu->spec().num_params), b(cpu->spec().num_params);
    cpu->Initialize(42, absl::MakeSpan(a));
    gpu->Initialize(42, absl::MakeSpan(b));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << c.name;
  }
}

TEST(CudaModelTest, LossGradientAndEvaluationMatchCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    const v1::ModelConfig config = ConfigOf(c);
    std::unique_ptr<Model> cpu = CpuModelOf(config);
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                                CudaModel::Create(config));
    const std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
    const OwnedBatch batch =
        RandomBatch(DeriveKey(c.seed, 7), c.rows, c.input_dim, c.classes);
    ExpectAgreement(*cpu, *gpu, params, batch, c.name);
  }
}

// Nothing is cached between calls: new values behind the same host pointer
// give the new answer, and batches of changing size reuse grown scratch.
TEST(CudaModelTest, FollowsChangedParamsAndBatchSizes) {
  CSERPS_SKIP_WITHOUT_GPU();
  const Case c = {"mlp", v1::ModelConfig::MLP, {24}, 30, 5, 0, 11};
  const v1::ModelConfig config = ConfigOf(c);
  std::unique_ptr<Model> cpu = CpuModelOf(config);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                              CudaModel::Create(config));
  std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
  const size_t sizes[] = {5, 300, 5, 64};
  for (size_t i = 0; i < 4; ++i) {
    const OwnedBatch batch =
        RandomBatch(DeriveKey(c.seed, 100 + i), sizes[i], c.input_dim, c.classes);
    ExpectAgreement(*cpu, *gpu, params, batch,
                    "step " + std::to_string(i) + ", rows " + std::to_string(sizes[i]));
    // In place, as an optimizer would.
    for (float& p : params) p *= 0.75f;
  }
}

TEST(CudaModelTest, EmptyBatchGivesZeroGradientAndLoss) {
  CSERPS_SKIP_WITHOUT_GPU();
  const Case c = {"mlp", v1::ModelConfig::MLP, {6}, 8, 3, 0, 12};
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                              CudaModel::Create(ConfigOf(c)));
  std::vector<float> params(gpu->spec().num_params, 0.5f);
  std::vector<float> grad(gpu->spec().num_params, NAN);
  const Batch empty{{}, {}, 0, c.input_dim};
  CSERPS_ASSERT_OK_AND_ASSIGN(const float loss,
                              gpu->TryLossAndGradient(params, empty, absl::MakeSpan(grad)));
  EXPECT_EQ(loss, 0.0f);
  for (float g : grad) ASSERT_EQ(g, 0.0f);
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums sums, gpu->TryEvaluate(params, empty));
  EXPECT_EQ(sums.count, 0u);
  EXPECT_EQ(sums.correct, 0u);
  EXPECT_EQ(sums.loss_sum, 0.0);
}

// Logits in the thousands: without the max subtraction exp() overflows to
// inf and the loss becomes NaN.
TEST(CudaModelTest, HugeLogitsStayFinite) {
  CSERPS_SKIP_WITHOUT_GPU();
  const Case c = {"softmax", v1::ModelConfig::SOFTMAX, {}, 16, 6, 0, 13};
  const v1::ModelConfig config = ConfigOf(c);
  std::unique_ptr<Model> cpu = CpuModelOf(config);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                              CudaModel::Create(config));
  std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
  for (float& p : params) p *= 3000.0f;
  const OwnedBatch batch = RandomBatch(DeriveKey(c.seed, 7), 40, c.input_dim, c.classes);
  std::vector<float> grad(params.size());
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float loss, gpu->TryLossAndGradient(params, batch.View(), absl::MakeSpan(grad)));
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 10.0f);  // wrong labels cost thousands here
  for (float g : grad) ASSERT_TRUE(std::isfinite(g));
  // Only the loss is compared: softmax probabilities this saturated amplify
  // the logits' rounding beyond the gradient tolerance.
  std::vector<float> cpu_grad(params.size());
  ExpectRelNear(cpu->LossAndGradient(params, batch.View(), absl::MakeSpan(cpu_grad)),
                loss, "huge logits: loss");
}

// The device API on caller-owned buffers and a caller's stream gives the
// host API's answer.
TEST(CudaModelTest, DeviceApiMatchesCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  const Case c = {"mlp", v1::ModelConfig::MLP, {32, 16}, 40, 7, 0, 14};
  const v1::ModelConfig config = ConfigOf(c);
  std::unique_ptr<Model> cpu = CpuModelOf(config);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                              CudaModel::Create(config));
  const ModelSpec& spec = cpu->spec();
  const std::vector<float> params = TestParams(spec, *cpu, c.seed);
  const OwnedBatch batch = RandomBatch(DeriveKey(c.seed, 7), 50, c.input_dim, c.classes);

  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_params, Upload(params));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_features, Upload(batch.features));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint8_t> d_labels, Upload(batch.labels));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_grad,
                              DeviceBuffer<float>::Allocate(spec.num_params));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_loss, DeviceBuffer<float>::Allocate(1));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<double> d_loss_sum,
                              DeviceBuffer<double>::Allocate(1));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<unsigned long long> d_correct,
                              DeviceBuffer<unsigned long long>::Allocate(1));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

  CSERPS_ASSERT_OK(gpu->Reserve(batch.labels.size()));
  CSERPS_ASSERT_OK(gpu->LossAndGradientDevice(
      d_params.data(), d_features.data(), d_labels.data(), batch.labels.size(),
      d_grad.data(), d_loss.data(), stream));
  CSERPS_ASSERT_OK(gpu->EvaluateDevice(d_params.data(), d_features.data(),
                                       d_labels.data(), batch.labels.size(),
                                       d_loss_sum.data(), d_correct.data(), stream));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> grad,
                              Download(d_grad.data(), spec.num_params));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> loss, Download(d_loss.data(), 1));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<double> loss_sum,
                              Download(d_loss_sum.data(), 1));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<unsigned long long> correct,
                              Download(d_correct.data(), 1));

  std::vector<float> cpu_grad(spec.num_params);
  const float cpu_loss = cpu->LossAndGradient(params, batch.View(), absl::MakeSpan(cpu_grad));
  const EvalSums cpu_eval = cpu->Evaluate(params, batch.View());
  ExpectRelNear(cpu_loss, loss[0], "device loss");
  ExpectGradientNear(spec, cpu_grad, grad, "device gradient");
  ExpectRelNear(cpu_eval.loss_sum, loss_sum[0], "device loss_sum");
  EXPECT_EQ(cpu_eval.correct, correct[0]);

  // rows == 0 through the device API: zero gradient, zero loss.
  CSERPS_ASSERT_OK(gpu->LossAndGradientDevice(d_params.data(), d_features.data(),
                                              d_labels.data(), 0, d_grad.data(),
                                              d_loss.data(), stream));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CSERPS_ASSERT_OK_AND_ASSIGN(grad, Download(d_grad.data(), spec.num_params));
  CSERPS_ASSERT_OK_AND_ASSIGN(loss, Download(d_loss.data(), 1));
  EXPECT_EQ(loss[0], 0.0f);
  for (float g : grad) ASSERT_EQ(g, 0.0f);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace cserps
