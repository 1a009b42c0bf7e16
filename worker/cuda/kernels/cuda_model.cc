#include "worker/cuda/kernels/cuda_model.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/kernels/conv_kernels.h"
#include "worker/cuda/kernels/model_kernels.h"
#include "worker/model/conv2d_layer.h"
#include "worker/model/initialize.h"

namespace cserps {
namespace {

int Dim(size_t n) { return static_cast<int>(n); }

size_t PatchSize(const ConvLayerSpec& conv) {
  return conv.in_channels * conv.kernel * conv.kernel;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(
    const v1::ModelConfig& config, const CudaModelOptions& options) {
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config));
  if (config.kind() != v1::ModelConfig::SOFTMAX &&
      config.kind() != v1::ModelConfig::MLP &&
      config.kind() != v1::ModelConfig::CNN) {
    return absl::UnimplementedError(absl::StrCat(
        "model.kind: the CUDA backend supports SOFTMAX, MLP and CNN, not ",
        v1::ModelConfig::Kind_Name(config.kind())));
  }
  for (size_t s = 0; s < spec.convs.size(); ++s) {
    const ConvLayerSpec& conv = spec.convs[s];
    // One image's im2col product must fit; CudaModel's constructor keeps
    // groups of images within int columns.
    if (PatchSize(conv) > INT_MAX || conv.out_channels > INT_MAX ||
        conv.height * conv.width > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: conv stage ", s, " (", conv.in_channels, " x ", conv.height,
          " x ", conv.width, " -> ", conv.out_channels, ", kernel ",
          conv.kernel, ") exceeds the int dimensions of cuBLAS"));
    }
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
  std::unique_ptr<CudaModel> model(new CudaModel(std::move(spec), options));
  RETURN_IF_ERROR(model->Init());
  return model;
}

CudaModel::CudaModel(ModelSpec spec, const CudaModelOptions& options)
    : spec_(std::move(spec)),
      activations_(spec_.layers.size()),
      pooled_(spec_.convs.size()),
      argmax_(spec_.convs.size()) {
  CSERPS_CHECK(!spec_.layers.empty());
  for (const LinearLayerSpec& layer : spec_.layers) {
    max_width_ = std::max({max_width_, layer.in, layer.out});
  }
  size_t per_image = 0;
  size_t max_plane = 1;
  for (const ConvLayerSpec& conv : spec_.convs) {
    max_width_ = std::max({max_width_, conv.input_size(), conv.output_size()});
    per_image = std::max(per_image, Conv2dWorkspaceSize(StageShape(conv, 1)));
    max_plane = std::max(max_plane, conv.height * conv.width);
  }
  if (!spec_.convs.empty()) {
    // A group's columns (images * height * width) are an int of cuBLAS.
    max_conv_group_ = std::clamp<size_t>(
        options.conv_workspace_floats / per_image, 1, INT_MAX / max_plane);
  }
}

absl::Status CudaModel::Init() {
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  // Full fp32 products: TF32 tensor cores would cost the agreement with the
  // CPU backend (about 1e-3 relative instead of 1e-6).
  CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  return absl::OkStatus();
}

CudaModel::~CudaModel() {
  if (cublas_ != nullptr) static_cast<void>(cublasDestroy(cublas_));
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
  const size_t group = std::min(rows, max_conv_group_);
  size_t cols = 0, conv_out = 0;
  for (size_t s = 0; s < spec_.convs.size(); ++s) {
    const ConvLayerSpec& conv = spec_.convs[s];
    ASSIGN_OR_RETURN(pooled_[s],
                     DeviceBuffer<float>::Allocate(rows * conv.output_size()));
    ASSIGN_OR_RETURN(argmax_[s],
                     DeviceBuffer<uint8_t>::Allocate(rows * conv.output_size()));
    cols = std::max(cols, PatchSize(conv) * group * conv.height * conv.width);
    conv_out = std::max(conv_out, group * conv.conv_output_size());
  }
  ASSIGN_OR_RETURN(cols_, DeviceBuffer<float>::Allocate(cols));
  ASSIGN_OR_RETURN(conv_out_, DeviceBuffer<float>::Allocate(conv_out));
  scratch_rows_ = rows;
  return absl::OkStatus();
}

const float* CudaModel::StageInput(size_t s, const float* d_features) const {
  return s == 0 ? d_features : pooled_[s - 1].data();
}

const float* CudaModel::LayerInput(size_t l, const float* d_features) const {
  if (l > 0) return activations_[l - 1].data();
  if (spec_.convs.empty()) return d_features;
  return pooled_.back().data();
}

absl::Status CudaModel::ConvStageForward(size_t s, const float* d_params,
                                         const float* d_features, size_t rows,
                                         cudaStream_t stream) {
  const ConvLayerSpec& conv = spec_.convs[s];
  const float* input = StageInput(s, d_features);
  const size_t group = std::min(rows, max_conv_group_);
  const float one = 1.0f, zero = 0.0f;
  for (size_t first = 0; first < rows; first += group) {
    const Conv2dShape shape = StageShape(conv, std::min(group, rows - first));
    const size_t columns = shape.images * conv.height * conv.width;
    RETURN_IF_ERROR(cuda::LaunchIm2Col(
        shape, input + first * conv.input_size(), cols_.data(), stream));
    // Row-major out (out_channels x columns) = K cols is column-major
    // out^T = cols^T K^T: cols is column-major cols^T (columns x patch), K
    // column-major K^T (patch x out_channels).
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_N, Dim(columns), Dim(conv.out_channels),
        Dim(PatchSize(conv)), &one, cols_.data(), Dim(columns),
        d_params + conv.weight_offset, Dim(PatchSize(conv)), &zero,
        conv_out_.data(), Dim(columns)));
    const size_t pooled_offset = first * conv.output_size();
    RETURN_IF_ERROR(cuda::LaunchBiasMaxPoolRelu(
        shape, conv_out_.data(), d_params + conv.bias_offset,
        pooled_[s].data() + pooled_offset, argmax_[s].data() + pooled_offset,
        stream));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::ConvStageBackward(size_t s, const float* d_params,
                                          const float* d_features, size_t rows,
                                          const float* dy, float* d_grad,
                                          float* dx, cudaStream_t stream) {
  const ConvLayerSpec& conv = spec_.convs[s];
  const float* input = StageInput(s, d_features);
  const size_t group = std::min(rows, max_conv_group_);
  const size_t patch = PatchSize(conv);
  const float one = 1.0f, zero = 0.0f;
  for (size_t first = 0; first < rows; first += group) {
    const Conv2dShape shape = StageShape(conv, std::min(group, rows - first));
    const size_t columns = shape.images * conv.height * conv.width;
    const size_t pooled_offset = first * conv.output_size();
    float* dout = conv_out_.data();
    RETURN_IF_ERROR(cuda::LaunchMaxPoolBackward(
        shape, dy + pooled_offset, argmax_[s].data() + pooled_offset, dout,
        stream));
    RETURN_IF_ERROR(cuda::LaunchIm2Col(
        shape, input + first * conv.input_size(), cols_.data(), stream));
    // Later groups add to the first group's sums, as Conv2dBackward does.
    const float beta = first == 0 ? 0.0f : 1.0f;
    // Row-major dK (out_channels x patch) = dout cols^T is column-major
    // dK^T = cols dout^T: cols is column-major cols^T (columns x patch),
    // used transposed; dout column-major dout^T (columns x out_channels).
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, Dim(patch), Dim(conv.out_channels),
        Dim(columns), &one, cols_.data(), Dim(columns), dout, Dim(columns),
        &beta, d_grad + conv.weight_offset, Dim(patch)));
    RETURN_IF_ERROR(cuda::LaunchChannelSums(conv.out_channels, columns, dout,
                                            /*accumulate=*/first > 0,
                                            d_grad + conv.bias_offset, stream));
    if (dx == nullptr) continue;
    // cols has served dK; it now receives d(cols) = K^T dout, row-major
    // patch x columns, i.e. column-major d(cols)^T = dout^T K with K
    // column-major K^T (patch x out_channels), used transposed.
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_T, Dim(columns), Dim(patch),
        Dim(conv.out_channels), &one, dout, Dim(columns),
        d_params + conv.weight_offset, Dim(patch), &zero, cols_.data(),
        Dim(columns)));
    RETURN_IF_ERROR(cuda::LaunchCol2Im(
        shape, cols_.data(), dx + first * conv.input_size(), stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> CudaModel::Forward(const float* d_params,
                                                const float* d_features,
                                                size_t rows,
                                                cudaStream_t stream) {
  for (size_t s = 0; s < spec_.convs.size(); ++s) {
    RETURN_IF_ERROR(ConvStageForward(s, d_params, d_features, rows, stream));
  }
  const float one = 1.0f, zero = 0.0f;
  const size_t num_layers = spec_.layers.size();
  for (size_t l = 0; l < num_layers; ++l) {
    const LinearLayerSpec& layer = spec_.layers[l];
    const float* x = LayerInput(l, d_features);
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
    const float* x = LayerInput(l, d_features);
    // dW (row-major out x in) is column-major dW^T = X^T dY: X is column-major
    // X^T (in x rows), dY column-major dY^T (out x rows), used transposed.
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_T, Dim(layer.in), Dim(layer.out),
        Dim(rows), &one, x, Dim(layer.in), dy, Dim(layer.out), &zero,
        d_grad + layer.weight_offset, Dim(layer.in)));
    RETURN_IF_ERROR(cuda::LaunchBiasGradient(rows, layer.out, dy,
                                             d_grad + layer.bias_offset, stream));
    // The features need no gradient; every other input is a ReLU output.
    if (l == 0 && spec_.convs.empty()) break;
    // dX (row-major rows x in) is column-major dX^T = W^T dY^T.
    CSERPS_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
        cublas_, CUBLAS_OP_N, CUBLAS_OP_N, Dim(layer.in), Dim(rows),
        Dim(layer.out), &one, d_params + layer.weight_offset, Dim(layer.in), dy,
        Dim(layer.out), &zero, dx, Dim(layer.in)));
    RETURN_IF_ERROR(
        cuda::LaunchReluBackward(rows * layer.in, x, dx, stream));
    std::swap(dy, dx);
  }
  for (size_t s = spec_.convs.size(); s-- > 0;) {
    RETURN_IF_ERROR(ConvStageBackward(s, d_params, d_features, rows, dy,
                                      d_grad, s > 0 ? dx : nullptr, stream));
    if (s == 0) break;
    RETURN_IF_ERROR(cuda::LaunchReluBackward(
        rows * spec_.convs[s].input_size(), StageInput(s, d_features), dx,
        stream));
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

}  // namespace cserps
