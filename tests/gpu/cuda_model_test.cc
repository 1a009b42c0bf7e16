// The CUDA model against the CPU backend (worker/model/cpu_model.h) on random
// data: same loss, gradient and evaluation to float rounding. CudaModel has
// only its device API; CudaOnHost below drives it on host spans, as the CPU
// model is called.
#include "worker/cuda/kernels/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/prng.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/cuda/kernels/read_back.h"
#include "worker/model/conv2d_layer.h"
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

// A CudaModel on host spans through its device API: each call uploads the
// parameters and the batch, queues the model's device call on a stream of
// its own (one stream for every call, so that cuBLAS repeats bit for bit),
// and reads the loss, the gradient or the sums back, waiting for them. No
// call's inputs are kept for the next. Argument violations abort, as
// Model's do.
class CudaOnHost {
 public:
  static absl::StatusOr<std::unique_ptr<CudaOnHost>> Create(
      const v1::ModelConfig& config, const CudaModelOptions& options = {}) {
    std::unique_ptr<CudaOnHost> gpu(new CudaOnHost);
    ASSIGN_OR_RETURN(gpu->model_, CudaModel::Create(config, options));
    if (gpu->stream_.get() == nullptr) return absl::InternalError("no CUDA stream");
    ASSIGN_OR_RETURN(gpu->read_back_, ScalarReadBack::Allocate());
    return gpu;
  }

  const ModelSpec& spec() const { return model_->spec(); }

  absl::StatusOr<float> LossAndGradient(absl::Span<const float> params,
                                        const Batch& batch, absl::Span<float> grad) {
    CSERPS_CHECK(grad.size() == spec().num_params);
    ASSIGN_OR_RETURN(Inputs in, UploadInputs(params, batch));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_grad, DeviceBuffer<float>::Allocate(grad.size()));
    RETURN_IF_ERROR(model_->LossAndGradientDevice(in.params.data(), in.features.data(),
                                                  in.labels.data(), batch.size, d_grad.data(),
                                                  read_back_.loss(), stream_.get()));
    ASSIGN_OR_RETURN(const float loss, read_back_.Loss(stream_.get()));
    ASSIGN_OR_RETURN(const std::vector<float> host_grad, Download(d_grad.data(), grad.size()));
    std::copy(host_grad.begin(), host_grad.end(), grad.begin());
    return loss;
  }

  absl::StatusOr<EvalSums> Evaluate(absl::Span<const float> params, const Batch& batch) {
    ASSIGN_OR_RETURN(Inputs in, UploadInputs(params, batch));
    RETURN_IF_ERROR(model_->EvaluateDevice(in.params.data(), in.features.data(),
                                           in.labels.data(), batch.size,
                                           read_back_.loss_sum(), read_back_.correct(),
                                           stream_.get()));
    return read_back_.Sums(batch.size, stream_.get());
  }

 private:
  struct Inputs {
    DeviceBuffer<float> params;
    DeviceBuffer<float> features;
    DeviceBuffer<uint8_t> labels;
  };

  CudaOnHost() = default;

  absl::StatusOr<Inputs> UploadInputs(absl::Span<const float> params,
                                      const Batch& batch) const {
    const ModelSpec& s = spec();
    CSERPS_CHECK(params.size() == s.num_params);
    CSERPS_CHECK(batch.dim == s.input_dim);
    CSERPS_CHECK(batch.features.size() == batch.size * batch.dim);
    CSERPS_CHECK(batch.labels.size() == batch.size);
    for (const uint8_t label : batch.labels) CSERPS_CHECK(label < s.num_classes);
    Inputs in;
    ASSIGN_OR_RETURN(in.params, Upload(params));
    ASSIGN_OR_RETURN(in.features, Upload(batch.features));
    ASSIGN_OR_RETURN(in.labels, Upload(batch.labels));
    return in;
  }

  std::unique_ptr<CudaModel> model_;
  TestStream stream_;
  ScalarReadBack read_back_;
};

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
  for (size_t s = 0; s < spec.convs.size(); ++s) {
    const ConvLayerSpec& conv = spec.convs[s];
    ExpectTensorNear(
        absl::MakeConstSpan(cpu).subspan(conv.weight_offset, conv.weight_size()),
        absl::MakeConstSpan(gpu).subspan(conv.weight_offset, conv.weight_size()),
        what + ": dK of conv stage " + std::to_string(s));
    ExpectTensorNear(
        absl::MakeConstSpan(cpu).subspan(conv.bias_offset, conv.out_channels),
        absl::MakeConstSpan(gpu).subspan(conv.bias_offset, conv.out_channels),
        what + ": dc of conv stage " + std::to_string(s));
  }
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
void ExpectAgreement(Model& cpu, CudaOnHost& gpu, const std::vector<float>& params,
                     const OwnedBatch& batch, const std::string& what) {
  const ModelSpec& spec = cpu.spec();
  std::vector<float> cpu_grad(spec.num_params), gpu_grad(spec.num_params, NAN);
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float cpu_loss,
      cpu.LossAndGradient(params, batch.View(), absl::MakeSpan(cpu_grad)));
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float gpu_loss,
      gpu.LossAndGradient(params, batch.View(), absl::MakeSpan(gpu_grad)));
  ExpectRelNear(cpu_loss, gpu_loss, what + ": loss");
  ExpectGradientNear(spec, cpu_grad, gpu_grad, what);

  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums cpu_eval, cpu.Evaluate(params, batch.View()));
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums gpu_eval,
                              gpu.Evaluate(params, batch.View()));
  ExpectRelNear(cpu_eval.loss_sum, gpu_eval.loss_sum, what + ": loss_sum");
  EXPECT_EQ(cpu_eval.correct, gpu_eval.correct) << what;
  EXPECT_EQ(cpu_eval.count, gpu_eval.count) << what;
}

TEST(CudaModelConfigTest, RejectsWhatItCannotRunWithoutTouchingTheDevice) {
  v1::ModelConfig softmax_with_hidden;
  softmax_with_hidden.set_kind(v1::ModelConfig::SOFTMAX);
  softmax_with_hidden.add_hidden(4);
  absl::StatusOr<std::unique_ptr<CudaModel>> model = CudaModel::Create(softmax_with_hidden);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(model.status().message(), "model.hidden"))
      << model.status();

  v1::ModelConfig even_kernel;
  even_kernel.set_kind(v1::ModelConfig::CNN);
  even_kernel.set_kernel_size(4);
  model = CudaModel::Create(even_kernel);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(model.status().message(), "model.kernel_size"))
      << model.status();
}

// A valid CNN is accepted: it fails only for want of a device.
TEST(CudaModelConfigTest, AcceptsCnn) {
  v1::ModelConfig cnn;
  cnn.set_kind(v1::ModelConfig::CNN);
  const absl::StatusOr<std::unique_ptr<CudaModel>> model = CudaModel::Create(cnn);
  if (CudaDeviceCount() == 0) {
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition)
        << model.status();
  } else {
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->spec().convs.size(), 2u);
  }
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

// Initialize gives the CPU backend's bits for `config`.
void ExpectInitializeEqualsCpu(const v1::ModelConfig& config, const std::string& name) {
  std::unique_ptr<Model> cpu = CpuModelOf(config);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu, CudaModel::Create(config));
  ASSERT_EQ(gpu->spec().num_params, cpu->spec().num_params);
  std::vector<float> a(cpu->spec().num_params), b(cpu->spec().num_params);
  cpu->Initialize(42, absl::MakeSpan(a));
  gpu->Initialize(42, absl::MakeSpan(b));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name;
}

TEST(CudaModelTest, InitializeEqualsCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) ExpectInitializeEqualsCpu(ConfigOf(c), c.name);
}

TEST(CudaModelTest, LossGradientAndEvaluationMatchCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const Case& c : Cases()) {
    const v1::ModelConfig config = ConfigOf(c);
    std::unique_ptr<Model> cpu = CpuModelOf(config);
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                                CudaOnHost::Create(config));
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
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                              CudaOnHost::Create(config));
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
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                              CudaOnHost::Create(ConfigOf(c)));
  std::vector<float> params(gpu->spec().num_params, 0.5f);
  std::vector<float> grad(gpu->spec().num_params, NAN);
  const Batch empty{{}, {}, 0, c.input_dim};
  CSERPS_ASSERT_OK_AND_ASSIGN(const float loss,
                              gpu->LossAndGradient(params, empty, absl::MakeSpan(grad)));
  EXPECT_EQ(loss, 0.0f);
  for (float g : grad) ASSERT_EQ(g, 0.0f);
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums sums, gpu->Evaluate(params, empty));
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
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                              CudaOnHost::Create(config));
  std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
  for (float& p : params) p *= 3000.0f;
  const OwnedBatch batch = RandomBatch(DeriveKey(c.seed, 7), 40, c.input_dim, c.classes);
  std::vector<float> grad(params.size());
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float loss, gpu->LossAndGradient(params, batch.View(), absl::MakeSpan(grad)));
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 10.0f);  // wrong labels cost thousands here
  for (float g : grad) ASSERT_TRUE(std::isfinite(g));
  // Only the loss is compared: softmax probabilities this saturated amplify
  // the logits' rounding beyond the gradient tolerance.
  std::vector<float> cpu_grad(params.size());
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float cpu_loss,
      cpu->LossAndGradient(params, batch.View(), absl::MakeSpan(cpu_grad)));
  ExpectRelNear(cpu_loss, loss, "huge logits: loss");
}

// The device API on caller-owned buffers and a caller's stream gives the
// CPU's answer.
void ExpectDeviceApiMatchesCpu(Model& cpu, CudaModel& gpu,
                               const std::vector<float>& params,
                               const OwnedBatch& batch) {
  const ModelSpec& spec = cpu.spec();

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
  TestStream test_stream;
  ASSERT_NE(test_stream.get(), nullptr);
  const cudaStream_t stream = test_stream.get();

  CSERPS_ASSERT_OK(gpu.Reserve(batch.labels.size()));
  CSERPS_ASSERT_OK(gpu.LossAndGradientDevice(
      d_params.data(), d_features.data(), d_labels.data(), batch.labels.size(),
      d_grad.data(), d_loss.data(), stream));
  CSERPS_ASSERT_OK(gpu.EvaluateDevice(d_params.data(), d_features.data(),
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
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float cpu_loss,
      cpu.LossAndGradient(params, batch.View(), absl::MakeSpan(cpu_grad)));
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums cpu_eval, cpu.Evaluate(params, batch.View()));
  ExpectRelNear(cpu_loss, loss[0], "device loss");
  ExpectGradientNear(spec, cpu_grad, grad, "device gradient");
  ExpectRelNear(cpu_eval.loss_sum, loss_sum[0], "device loss_sum");
  EXPECT_EQ(cpu_eval.correct, correct[0]);

  // rows == 0 through the device API: zero gradient, zero loss.
  CSERPS_ASSERT_OK(gpu.LossAndGradientDevice(d_params.data(), d_features.data(),
                                             d_labels.data(), 0, d_grad.data(),
                                             d_loss.data(), stream));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CSERPS_ASSERT_OK_AND_ASSIGN(grad, Download(d_grad.data(), spec.num_params));
  CSERPS_ASSERT_OK_AND_ASSIGN(loss, Download(d_loss.data(), 1));
  EXPECT_EQ(loss[0], 0.0f);
  for (float g : grad) ASSERT_EQ(g, 0.0f);
}

TEST(CudaModelTest, DeviceApiMatchesCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  const Case c = {"mlp", v1::ModelConfig::MLP, {32, 16}, 40, 7, 0, 14};
  const v1::ModelConfig config = ConfigOf(c);
  std::unique_ptr<Model> cpu = CpuModelOf(config);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> gpu,
                              CudaModel::Create(config));
  const std::vector<float> params = TestParams(cpu->spec(), *cpu, c.seed);
  const OwnedBatch batch = RandomBatch(DeriveKey(c.seed, 7), 50, c.input_dim, c.classes);
  ExpectDeviceApiMatchesCpu(*cpu, *gpu, params, batch);
}

// CNN cases. Their data are chosen so that the forward pass through the conv
// stages is exact in float, whatever the order of the sums: features are
// multiples of 2^-3, conv kernels multiples of 2^-6 and conv biases of the
// stage's output quantum, and every partial sum stays within the range where
// floats hold every multiple of that quantum (CnnForwardIsExact checks it on
// the host). Both backends then pool the same bits, so a max-pool tie (which
// the coarse data make common) or a ReLU at 0 goes the same way on both, and
// only the backward sums and the linear layer differ by rounding.
struct CnnCase {
  std::string name;
  std::vector<uint32_t> conv_channels;  // empty: the default [16, 32]
  uint32_t kernel;                      // 0: the defaults, for all four
  uint32_t height;
  uint32_t width;
  uint32_t image_channels;
  uint32_t classes;
  size_t rows;
  uint64_t seed;
};

constexpr int kFeatureBits = 3;  // features are multiples of 2^-3
constexpr int kKernelBits = 6;   // conv kernels are multiples of 2^-6

std::vector<CnnCase> CnnCases() {
  return {
      {"cnn_default_one_image", {}, 0, 0, 0, 0, 10, 1, 21},
      // More images than the CPU's conv group of 8, and not a multiple.
      {"cnn_default_13_images", {}, 0, 0, 0, 0, 10, 13, 22},
      // Non-square, odd sides (a row and a column dropped by each pool),
      // three input channels, k = 3.
      {"cnn_k3_odd_one_image", {5, 4}, 3, 11, 7, 3, 6, 1, 23},
      {"cnn_k3_odd_19_images", {5, 4}, 3, 11, 7, 3, 6, 19, 24},
      // No padding at all.
      {"cnn_k1", {3}, 1, 4, 6, 2, 3, 9, 25},
      // A kernel wider than the image: most taps read padding.
      {"cnn_kernel_exceeds_image", {3}, 5, 3, 2, 2, 4, 10, 26},
  };
}

// CnnFollowsChangedParamsAndBatchSizes: new parameters (another seed) and
// another batch size at each step, on CnnCases()[3]'s model.
std::vector<CnnCase> CnnStepCases() {
  std::vector<CnnCase> steps;
  const size_t rows[] = {5, 70, 3, 33};
  for (size_t i = 0; i < 4; ++i) {
    CnnCase c = CnnCases()[3];
    c.name = "step " + std::to_string(i) + ", rows " + std::to_string(rows[i]);
    c.rows = rows[i];
    c.seed = 31 + i;
    steps.push_back(c);
  }
  return steps;
}

v1::ModelConfig ConfigOf(const CnnCase& c) {
  v1::ModelConfig config;
  config.set_kind(v1::ModelConfig::CNN);
  for (uint32_t channels : c.conv_channels) config.add_conv_channels(channels);
  config.set_kernel_size(c.kernel);
  config.set_image_height(c.height);
  config.set_image_width(c.width);
  config.set_image_channels(c.image_channels);
  config.set_num_classes(c.classes);
  return config;
}

OwnedBatch QuantizedBatch(uint64_t key, size_t rows, size_t dim, size_t classes) {
  CounterRng rng(key);
  OwnedBatch b;
  b.dim = dim;
  b.features.resize(rows * dim);
  const int steps = 1 << kFeatureBits;  // values in [-1, 1]
  for (float& x : b.features) {
    x = std::ldexp(static_cast<float>(static_cast<int>(rng.Below(2 * steps + 1)) - steps),
                   -kFeatureBits);
  }
  b.labels.resize(rows);
  for (uint8_t& y : b.labels) y = static_cast<uint8_t>(rng.Below(classes));
  return b;
}

// The exponent q of conv stage s's output quantum 2^-q.
int StageOutputBits(size_t s) {
  return kFeatureBits + static_cast<int>(s + 1) * kKernelBits;
}

// Initialised weights with the conv kernels rounded to multiples of 2^-6,
// conv biases random multiples of the stage's output quantum in about
// [-0.2, 0.2], linear biases random floats.
std::vector<float> QuantizedCnnParams(const ModelSpec& spec, const Model& model,
                                      uint64_t seed) {
  std::vector<float> params(spec.num_params);
  model.Initialize(seed, absl::MakeSpan(params));
  CounterRng rng(DeriveKey(seed, 99));
  for (size_t s = 0; s < spec.convs.size(); ++s) {
    const ConvLayerSpec& conv = spec.convs[s];
    for (size_t i = 0; i < conv.weight_size(); ++i) {
      float& w = params[conv.weight_offset + i];
      w = std::ldexp(std::nearbyint(std::ldexp(w, kKernelBits)), -kKernelBits);
    }
    const int bits = StageOutputBits(s);
    const uint64_t range = static_cast<uint64_t>(std::ldexp(0.2, bits));
    for (size_t o = 0; o < conv.out_channels; ++o) {
      const double quanta = static_cast<double>(rng.Below(2 * range + 1)) -
                            static_cast<double>(range);
      params[conv.bias_offset + o] = static_cast<float>(std::ldexp(quanta, -bits));
    }
  }
  for (const LinearLayerSpec& layer : spec.layers) {
    for (size_t j = 0; j < layer.out; ++j) {
      params[layer.bias_offset + j] = 0.4f * rng.UniformFloat() - 0.2f;
    }
  }
  return params;
}

bool OnGrid(double v, int bits) {
  const double scaled = std::ldexp(v, bits);
  return scaled == std::nearbyint(scaled);
}

// What CnnForwardIsExact checks, from a plain double forward pass.
struct CnnExactness {
  bool inputs_on_grid = true;  // features, kernels, biases, stage inputs
  // The largest, over conv outputs, of (|bias| + sum of |tap products|) *
  // 2^q / 2^24 for the stage's quantum 2^-q: every partial sum of the
  // output is an exact float when this is <= 1.
  double worst_range = 0;
  double min_margin = INFINITY;  // between a row's two largest logits
};

CnnExactness ReferenceCnnExactness(const ModelSpec& spec,
                                   const std::vector<float>& params,
                                   const OwnedBatch& batch) {
  CnnExactness e;
  const size_t rows = batch.labels.size();
  for (size_t r = 0; r < rows; ++r) {
    std::vector<double> a(batch.features.begin() + r * batch.dim,
                          batch.features.begin() + (r + 1) * batch.dim);
    int input_bits = kFeatureBits;
    for (size_t s = 0; s < spec.convs.size(); ++s) {
      const ConvLayerSpec& c = spec.convs[s];
      const int bits = StageOutputBits(s);
      for (double v : a) e.inputs_on_grid &= OnGrid(v, input_bits);
      for (size_t i = 0; i < c.weight_size(); ++i) {
        e.inputs_on_grid &= OnGrid(params[c.weight_offset + i], kKernelBits);
      }
      const long pad = static_cast<long>(c.kernel / 2);
      const long h = static_cast<long>(c.height), w = static_cast<long>(c.width);
      std::vector<double> z(c.conv_output_size());
      for (size_t o = 0; o < c.out_channels; ++o) {
        const double bias = params[c.bias_offset + o];
        e.inputs_on_grid &= OnGrid(bias, bits);
        for (long y = 0; y < h; ++y) {
          for (long x = 0; x < w; ++x) {
            double sum = bias, range = std::fabs(bias);
            for (size_t i = 0; i < c.in_channels; ++i) {
              for (long ky = 0; ky < static_cast<long>(c.kernel); ++ky) {
                for (long kx = 0; kx < static_cast<long>(c.kernel); ++kx) {
                  const long iy = y + ky - pad, ix = x + kx - pad;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  const double t =
                      params[c.weight_offset +
                             ((o * c.in_channels + i) * c.kernel + ky) * c.kernel + kx] *
                      a[(i * c.height + iy) * c.width + ix];
                  sum += t;
                  range += std::fabs(t);
                }
              }
            }
            e.worst_range = std::max(e.worst_range, std::ldexp(range, bits - 24));
            z[(o * c.height + y) * c.width + x] = sum;
          }
        }
      }
      std::vector<double> pooled(c.output_size());
      for (size_t o = 0; o < c.out_channels; ++o) {
        for (size_t py = 0; py < c.pooled_height; ++py) {
          for (size_t px = 0; px < c.pooled_width; ++px) {
            double m = 0;  // ReLU folded in
            for (size_t dy = 0; dy < 2; ++dy) {
              for (size_t dx = 0; dx < 2; ++dx) {
                m = std::max(m, z[(o * c.height + 2 * py + dy) * c.width + 2 * px + dx]);
              }
            }
            pooled[(o * c.pooled_height + py) * c.pooled_width + px] = m;
          }
        }
      }
      a = std::move(pooled);
      input_bits = bits;
    }
    const LinearLayerSpec& layer = spec.layers.back();
    std::vector<double> logits(layer.out);
    for (size_t o = 0; o < layer.out; ++o) {
      double sum = params[layer.bias_offset + o];
      for (size_t i = 0; i < layer.in; ++i) {
        sum += static_cast<double>(params[layer.weight_offset + o * layer.in + i]) * a[i];
      }
      logits[o] = sum;
    }
    std::sort(logits.rbegin(), logits.rend());
    if (logits.size() > 1) e.min_margin = std::min(e.min_margin, logits[0] - logits[1]);
  }
  return e;
}

struct CnnFixture {
  std::unique_ptr<Model> cpu;
  std::vector<float> params;
  OwnedBatch batch;
};

CnnFixture MakeCnnFixture(const CnnCase& c) {
  CnnFixture f;
  f.cpu = CpuModelOf(ConfigOf(c));
  if (f.cpu == nullptr) return f;
  const ModelSpec& spec = f.cpu->spec();
  f.params = QuantizedCnnParams(spec, *f.cpu, c.seed);
  f.batch = QuantizedBatch(DeriveKey(c.seed, 7), c.rows, spec.input_dim, c.classes);
  return f;
}

// Conv groups of `images` images for `spec`: the smallest budget that holds
// them.
CudaModelOptions GroupsOf(const ModelSpec& spec, size_t images) {
  size_t per_image = 0;
  for (const ConvLayerSpec& c : spec.convs) {
    per_image = std::max(per_image,
                         Conv2dWorkspaceSize({1, c.in_channels, c.height, c.width,
                                              c.out_channels, c.kernel}));
  }
  CudaModelOptions options;
  options.conv_workspace_floats = images * per_image;
  return options;
}

// The precondition of the CNN agreement tests, on the host only.
TEST(CudaModelDataTest, CnnForwardIsExact) {
  std::vector<CnnCase> cases = CnnCases();
  for (const CnnCase& c : CnnStepCases()) cases.push_back(c);
  for (const CnnCase& c : cases) {
    const CnnFixture f = MakeCnnFixture(c);
    ASSERT_NE(f.cpu, nullptr) << c.name;
    const CnnExactness e = ReferenceCnnExactness(f.cpu->spec(), f.params, f.batch);
    EXPECT_TRUE(e.inputs_on_grid) << c.name;
    EXPECT_LE(e.worst_range, 1.0) << c.name;
    EXPECT_GT(e.min_margin, kMinDistance) << c.name;
  }
}

TEST(CudaModelTest, CnnInitializeEqualsCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const CnnCase& c : CnnCases()) ExpectInitializeEqualsCpu(ConfigOf(c), c.name);
}

TEST(CudaModelTest, CnnLossGradientAndEvaluationMatchCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const CnnCase& c : CnnCases()) {
    CnnFixture f = MakeCnnFixture(c);
    ASSERT_NE(f.cpu, nullptr);
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                                CudaOnHost::Create(ConfigOf(c)));
    ExpectAgreement(*f.cpu, *gpu, f.params, f.batch, c.name);
  }
}

// Conv groups of 1, 4 (the last one partial) and 7 images give the CPU's
// answer too: each group's slice of the batch, its pooling choices and the
// accumulation of the kernel and bias gradients across groups.
TEST(CudaModelTest, CnnConvGroupsMatchCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  const CnnCase c = CnnCases()[3];  // k3, odd sides, 19 images
  CnnFixture f = MakeCnnFixture(c);
  ASSERT_NE(f.cpu, nullptr);
  for (const size_t images : {size_t{1}, size_t{4}, size_t{7}}) {
    CSERPS_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<CudaOnHost> gpu,
        CudaOnHost::Create(ConfigOf(c), GroupsOf(f.cpu->spec(), images)));
    ExpectAgreement(*f.cpu, *gpu, f.params, f.batch,
                    "groups of " + std::to_string(images));
  }
}

// No atomics anywhere: the same call repeats bit for bit, also after a
// call on another batch in between.
TEST(CudaModelTest, CnnRepeatsBitForBit) {
  CSERPS_SKIP_WITHOUT_GPU();
  const CnnCase c = CnnCases()[1];  // the default CNN
  CnnFixture f = MakeCnnFixture(c);
  ASSERT_NE(f.cpu, nullptr);
  const ModelSpec& spec = f.cpu->spec();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaOnHost> gpu,
                              CudaOnHost::Create(ConfigOf(c), GroupsOf(spec, 5)));
  const OwnedBatch other =
      QuantizedBatch(DeriveKey(c.seed, 8), 40, spec.input_dim, c.classes);
  std::vector<float> first(spec.num_params), second(spec.num_params),
      scratch(spec.num_params);
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float loss1,
      gpu->LossAndGradient(f.params, f.batch.View(), absl::MakeSpan(first)));
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums eval1,
                              gpu->Evaluate(f.params, f.batch.View()));
  CSERPS_ASSERT_OK(
      gpu->LossAndGradient(f.params, other.View(), absl::MakeSpan(scratch))
          .status());
  CSERPS_ASSERT_OK_AND_ASSIGN(
      const float loss2,
      gpu->LossAndGradient(f.params, f.batch.View(), absl::MakeSpan(second)));
  CSERPS_ASSERT_OK_AND_ASSIGN(const EvalSums eval2,
                              gpu->Evaluate(f.params, f.batch.View()));
  EXPECT_EQ(std::memcmp(&loss1, &loss2, sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&eval1.loss_sum, &eval2.loss_sum, sizeof(double)), 0);
  EXPECT_EQ(eval1.correct, eval2.correct);
}

// Nothing is cached between calls and growing and shrinking batches reuse
// the conv scratch: new parameters in the same host buffer and batches of
// changing size (in groups of 16 images, so some steps have several) give
// the CPU's answer at every step.
TEST(CudaModelTest, CnnFollowsChangedParamsAndBatchSizes) {
  CSERPS_SKIP_WITHOUT_GPU();
  const std::vector<CnnCase> steps = CnnStepCases();
  std::unique_ptr<Model> cpu = CpuModelOf(ConfigOf(steps[0]));
  ASSERT_NE(cpu, nullptr);
  CSERPS_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<CudaOnHost> gpu,
      CudaOnHost::Create(ConfigOf(steps[0]), GroupsOf(cpu->spec(), 16)));
  std::vector<float> params(cpu->spec().num_params);
  for (const CnnCase& c : steps) {
    CnnFixture f = MakeCnnFixture(c);
    ASSERT_NE(f.cpu, nullptr);
    std::copy(f.params.begin(), f.params.end(), params.begin());
    ExpectAgreement(*cpu, *gpu, params, f.batch, c.name);
  }
}

TEST(CudaModelTest, CnnDeviceApiMatchesCpu) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const CnnCase& c : {CnnCases()[1], CnnCases()[3]}) {
    SCOPED_TRACE(c.name);
    CnnFixture f = MakeCnnFixture(c);
    ASSERT_NE(f.cpu, nullptr);
    CSERPS_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<CudaModel> gpu,
        CudaModel::Create(ConfigOf(c), GroupsOf(f.cpu->spec(), 4)));
    ExpectDeviceApiMatchesCpu(*f.cpu, *gpu, f.params, f.batch);
  }
}

}  // namespace
}  // namespace cserps
