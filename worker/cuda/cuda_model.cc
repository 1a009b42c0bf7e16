#include "worker/cuda/cuda_model.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/model_kernels.h"
#include "worker/model/initialize.h"

namespace cserps {
namespace {

int Dim(size_t n) { return static_cast<int>(n); }

// The Model interface has no Status: a device failure in the middle of a
// step leaves nothing to recover, so it ends the process with the reason.
template <typename T>
T ValueOrDie(absl::StatusOr<T> result, const char* call) {
  if (!result.ok()) {
    const std::string message = result.status().ToString();
    std::fprintf(stderr, "CudaModel::%s: %s\n", call, message.c_str());
    std::abort();
  }
  return *std::move(result);
}

template <typename T>
absl::Status Grow(size_t count, DeviceBuffer<T>* buffer) {
  if (buffer->size() >= count) return absl::OkStatus();
  ASSIGN_OR_RETURN(*buffer, DeviceBuffer<T>::Allocate(count));
  return absl::OkStatus();
}

template <typename T>
absl::Status Grow(size_t count, PinnedBuffer<T>* buffer) {
  if (buffer->size() >= count) return absl::OkStatus();
  ASSIGN_OR_RETURN(*buffer, PinnedBuffer<T>::Allocate(count));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(
    const v1::ModelConfig& config) {
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config));
  if (config.kind() != v1::ModelConfig::SOFTMAX &&
      config.kind() != v1::ModelConfig::MLP) {
    return absl::UnimplementedError(absl::StrCat(
        "model.kind: the CUDA backend supports SOFTMAX and MLP, not ",
        v1::ModelConfig::Kind_Name(config.kind())));
  }
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    if (spec.layers[l].in > INT_MAX || spec.layers[l].out > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: layer ", l, " (", spec.layers[l].in, " -> ",
          spec.layers[l].out, ") exceeds the int dimensions of cuBLAS"));
    }
  }
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "CUDA backend: no CUDA device is present");
  }
  int device = 0;
  CSERPS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::unique_ptr<CudaModel> model(new CudaModel(std::move(spec), device));
  RETURN_IF_ERROR(model->Init());
  return model;
}

absl::StatusOr<std::unique_ptr<Model>> MakeCudaModel(
    const v1::ModelConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model, CudaModel::Create(config));
  return std::unique_ptr<Model>(std::move(model));
}

CudaModel::CudaModel(ModelSpec spec, int device)
    : spec_(std::move(spec)), device_(device), activations_(spec_.layers.size()) {
  CSERPS_CHECK(!spec_.layers.empty());
  for (const LinearLayerSpec& layer : spec_.layers) {
    max_width_ = std::max({max_width_, layer.in, layer.out});
  }
}

absl::Status CudaModel::Init() {
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  // Full fp32 products: TF32 tensor cores would cost the agreement with the
  // CPU backend (about 1e-3 relative instead of 1e-6).
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  ASSIGN_OR_RETURN(loss_, DeviceBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(loss_sum_, DeviceBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(correct_, DeviceBuffer<unsigned long long>::Allocate(1));
  ASSIGN_OR_RETURN(host_loss_, PinnedBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(host_loss_sum_, PinnedBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(host_correct_, PinnedBuffer<unsigned long long>::Allocate(1));
  return absl::OkStatus();
}

CudaModel::~CudaModel() {
  if (cublas_ != nullptr) static_cast<void>(cublasDestroy(cublas_));
  if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
}

void CudaModel::Initialize(uint64_t seed, absl::Span<float> params) const {
  InitializeParameters(spec_, seed, params);
}

absl::Status CudaModel::Reserve(size_t rows) {
  if (rows <= scratch_rows_) return absl::OkStatus();
  if (rows > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaModel: a batch of ", rows, " rows exceeds the int dimensions of cuBLAS"));
  }
  // The old buffers may still be read by queued work on any stream.
  CSERPS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    ASSIGN_OR_RETURN(activations_[l],
                     DeviceBuffer<float>::Allocate(rows * spec_.layers[l].out));
  }
  ASSIGN_OR_RETURN(grad_out_, DeviceBuffer<float>::Allocate(rows * max_width_));
  ASSIGN_OR_RETURN(grad_in_, DeviceBuffer<float>::Allocate(rows * max_width_));
  ASSIGN_OR_RETURN(row_loss_, DeviceBuffer<double>::Allocate(rows));
  ASSIGN_OR_RETURN(row_correct_, DeviceBuffer<uint32_t>::Allocate(rows));
  scratch_rows_ = rows;
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaModel::Forward(const float* d_params,
                                                const float* d_features,
                                                size_t rows,
                                                cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  const size_t num_layers = spec_.layers.size();
  for (size_t l = 0; l < num_layers; ++l) {
    const LinearLayerSpec& layer = spec_.layers[l];
    const float* x = l == 0 ? d_features : activations_[l - 1].data();
    float* y = activations_[l].data();
    // Row-major Y (rows x out) is column-major Y^T = W X^T: W is column-major
    // W^T (in x out) and X column-major X^T (in x rows).
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, Dim(layer.out), Dim(rows),
        Dim(layer.in), &one, d_params + layer.weight_offset, Dim(layer.in), x,
        Dim(layer.in), &zero, y, Dim(layer.out)));
    RETURN_IF_ERROR(cuda::LaunchBiasActivation(
        rows, layer.out, d_params + layer.bias_offset,
        /*relu=*/l + 1 < num_layers, y, stream));
  }
  return activations_[num_layers - 1].data();
}

absl::Status CudaModel::LossAndGradientDevice(const float* d_params,
                                              const float* d_features,
                                              const uint8_t* d_labels,
                                              size_t rows, float* d_grad,
                                              float* d_loss,
                                              cudaStream_t stream) {
  if (rows == 0) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        d_grad, 0, spec_.num_params * sizeof(float), stream));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_loss, 0, sizeof(float), stream));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Reserve(rows));
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream));
  ASSIGN_OR_RETURN(const float* logits, Forward(d_params, d_features, rows, stream));

  float* dy = grad_out_.data();
  float* dx = grad_in_.data();
  RETURN_IF_ERROR(cuda::LaunchSoftmaxCrossEntropy(
      rows, spec_.num_classes, logits, d_labels,
      1.0f / static_cast<float>(rows), dy, row_loss_.data(),
      row_correct_.data(), stream));
  RETURN_IF_ERROR(cuda::LaunchSumRows(rows, row_loss_.data(),
                                      row_correct_.data(), d_loss,
                                      /*loss_sum=*/nullptr,
                                      /*correct=*/nullptr, stream));

  const float one = 1.0f, zero = 0.0f;
  for (size_t l = spec_.layers.size(); l-- > 0;) {
    const LinearLayerSpec& layer = spec_.layers[l];
    const float* x = l == 0 ? d_features : activations_[l - 1].data();
    // dW (row-major out x in) is column-major dW^T = X^T dY: X is column-major
    // X^T (in x rows), dY column-major dY^T (out x rows), used transposed.
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_T, Dim(layer.in), Dim(layer.out),
        Dim(rows), &one, x, Dim(layer.in), dy, Dim(layer.out), &zero,
        d_grad + layer.weight_offset, Dim(layer.in)));
    RETURN_IF_ERROR(cuda::LaunchBiasGradient(rows, layer.out, dy,
                                             d_grad + layer.bias_offset, stream));
    if (l == 0) break;
    // dX (row-major rows x in) is column-major dX^T = W^T dY^T.
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_N, Dim(layer.in), Dim(rows),
        Dim(layer.out), &one, d_params + layer.weight_offset, Dim(layer.in), dy,
        Dim(layer.out), &zero, dx, Dim(layer.in)));
    RETURN_IF_ERROR(cuda::LaunchReluBackward(
        rows * layer.in, activations_[l - 1].data(), dx, stream));
    std::swap(dy, dx);
  }
  return absl::OkStatus();
}

absl::Status CudaModel::EvaluateDevice(const float* d_params,
                                       const float* d_features,
                                       const uint8_t* d_labels, size_t rows,
                                       double* d_loss_sum,
                                       unsigned long long* d_correct,
                                       cudaStream_t stream) {
  if (rows == 0) {
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(d_loss_sum, 0, sizeof(double), stream));
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(d_correct, 0, sizeof(unsigned long long), stream));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Reserve(rows));
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream));
  ASSIGN_OR_RETURN(const float* logits, Forward(d_params, d_features, rows, stream));
  RETURN_IF_ERROR(cuda::LaunchSoftmaxCrossEntropy(
      rows, spec_.num_classes, logits, d_labels, 0.0f, /*dlogits=*/nullptr,
      row_loss_.data(), row_correct_.data(), stream));
  return cuda::LaunchSumRows(rows, row_loss_.data(), row_correct_.data(),
                             /*mean_loss=*/nullptr, d_loss_sum, d_correct,
                             stream);
}

absl::Status CudaModel::ReserveStaging(size_t rows) {
  const size_t n = spec_.num_params;
  RETURN_IF_ERROR(Grow(n, &host_params_));
  RETURN_IF_ERROR(Grow(n, &host_grad_));
  RETURN_IF_ERROR(Grow(n, &params_));
  RETURN_IF_ERROR(Grow(n, &grad_));
  if (rows <= staging_rows_) return absl::OkStatus();
  // Host-span calls end with a stream synchronisation, so nothing queued
  // still reads the buffers replaced here.
  RETURN_IF_ERROR(Grow(rows * spec_.input_dim, &host_features_));
  RETURN_IF_ERROR(Grow(rows, &host_labels_));
  RETURN_IF_ERROR(Grow(rows * spec_.input_dim, &features_));
  RETURN_IF_ERROR(Grow(rows, &labels_));
  staging_rows_ = rows;
  return absl::OkStatus();
}

absl::Status CudaModel::StageIn(absl::Span<const float> params,
                                const Batch& batch) {
  std::memcpy(host_params_.data(), params.data(), params.size() * sizeof(float));
  std::memcpy(host_features_.data(), batch.features.data(),
              batch.features.size() * sizeof(float));
  std::memcpy(host_labels_.data(), batch.labels.data(), batch.labels.size());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      params_.data(), host_params_.data(), params.size() * sizeof(float),
      cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      features_.data(), host_features_.data(),
      batch.features.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      labels_.data(), host_labels_.data(), batch.labels.size(),
      cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

void CudaModel::CheckArguments(absl::Span<const float> params,
                               const Batch& batch) const {
  CSERPS_CHECK(params.size() == spec_.num_params);
  CSERPS_CHECK(batch.dim == spec_.input_dim);
  CSERPS_CHECK(batch.features.size() == batch.size * batch.dim);
  CSERPS_CHECK(batch.labels.size() == batch.size);
  for (const uint8_t label : batch.labels) CSERPS_CHECK(label < spec_.num_classes);
}

absl::StatusOr<float> CudaModel::TryLossAndGradient(
    absl::Span<const float> params, const Batch& batch,
    absl::Span<float> grad) {
  CheckArguments(params, batch);
  CSERPS_CHECK(grad.size() == spec_.num_params);
  if (batch.size == 0) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return 0.0f;
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  RETURN_IF_ERROR(ReserveStaging(batch.size));
  RETURN_IF_ERROR(StageIn(params, batch));
  RETURN_IF_ERROR(LossAndGradientDevice(params_.data(), features_.data(),
                                        labels_.data(), batch.size,
                                        grad_.data(), loss_.data(), stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      host_grad_.data(), grad_.data(), grad.size() * sizeof(float),
      cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_loss_.data(), loss_.data(),
                                              sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::memcpy(grad.data(), host_grad_.data(), grad.size() * sizeof(float));
  return host_loss_.data()[0];
}

absl::StatusOr<EvalSums> CudaModel::TryEvaluate(absl::Span<const float> params,
                                                const Batch& batch) {
  CheckArguments(params, batch);
  EvalSums sums;
  if (batch.size == 0) return sums;
  CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  RETURN_IF_ERROR(ReserveStaging(batch.size));
  RETURN_IF_ERROR(StageIn(params, batch));
  RETURN_IF_ERROR(EvaluateDevice(params_.data(), features_.data(),
                                 labels_.data(), batch.size, loss_sum_.data(),
                                 correct_.data(), stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      host_loss_sum_.data(), loss_sum_.data(), sizeof(double),
      cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      host_correct_.data(), correct_.data(), sizeof(unsigned long long),
      cudaMemcpyDeviceToHost, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  sums.loss_sum = host_loss_sum_.data()[0];
  sums.correct = static_cast<size_t>(host_correct_.data()[0]);
  sums.count = batch.size;
  return sums;
}

float CudaModel::LossAndGradient(absl::Span<const float> params,
                                 const Batch& batch, absl::Span<float> grad) {
  return ValueOrDie(TryLossAndGradient(params, batch, grad), "LossAndGradient");
}

EvalSums CudaModel::Evaluate(absl::Span<const float> params,
                             const Batch& batch) {
  return ValueOrDie(TryEvaluate(params, batch), "Evaluate");
}

}  // namespace cserps
