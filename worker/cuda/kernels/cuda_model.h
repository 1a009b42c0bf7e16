// The CUDA model for SOFTMAX, MLP and CNN models, the GPU twin of CpuModel
// (worker/model/cpu_model.h): cuBLAS sgemm for the linear layers, kernels
// (model_kernels.h) for bias, ReLU and softmax cross-entropy; a CNN's conv
// stages as im2col + cuBLAS sgemm, bias + 2x2 max-pool + ReLU, and col2im
// for the input gradient (conv_kernels.h). Same layout, same initialisation
// and the same mathematics as CpuModel, to float rounding (sums run in
// another order); max-pool ties go to the same pixel. Products are full fp32
// (no TF32), and no kernel uses atomics: the same call on the same device
// repeats bit for bit (cuBLAS promises as much while one stream is active).
//
// One way in, the device API (LossAndGradientDevice, EvaluateDevice), for a
// trainer that keeps parameters, data and gradients on the device
// (CudaBackend, worker/cuda/cuda_backend.h, which uploads the batches and
// reads the loss back): all pointers are device pointers that must stay
// valid until the work queued on `stream` has run; nothing synchronises.
// It is not a Model (worker/model/model.h, host spans): the GPU tests drive
// it on host spans through this API (tests/gpu/cuda_model_test.cc).
//
// A CNN's conv stages run on groups of images (CudaModelOptions) so that
// their scratch stays bounded however large the batch.
//
// The device that was current at Create must be current on the calling
// thread. Scratch memory grows to the largest batch seen (Reserve() grows it
// ahead of time, so that the steps that follow allocate nothing); growing
// waits for the device to go idle. Not thread-safe: one CudaModel per thread.
#ifndef CSERPS_WORKER_CUDA_KERNELS_CUDA_MODEL_H_
#define CSERPS_WORKER_CUDA_KERNELS_CUDA_MODEL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "cserps/v1/config.pb.h"
#include "worker/cuda/kernels/cuda_status.h"

namespace cserps {

struct CudaModelOptions {
  // Bound on a conv stage's scratch in floats (the im2col matrix plus the
  // convolution's channel-major output, as Conv2dWorkspaceSize counts them
  // for worker/model/conv2d_layer.h): a CNN's stages run on groups of as
  // many images as fit, at least one. The default (64 MiB) holds about 200
  // images of the default CNN, so training batches run as one group and an
  // evaluation batch of 1000 in a few. Ignored for SOFTMAX and MLP.
  size_t conv_workspace_floats = size_t{1} << 24;
};

class CudaModel {
 public:
  // InvalidArgument naming the field for a config that describes no valid
  // model, or whose layer or conv stage exceeds the int dimensions of
  // cuBLAS; Unimplemented for a model kind this backend lacks (any but
  // SOFTMAX, MLP and CNN); FailedPrecondition when no CUDA device is present;
  // the cuBLAS error when the cuBLAS handle cannot be created.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(
      const v1::ModelConfig& config, const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  // Host-side: identical to CpuModel::Initialize (worker/model/initialize.h);
  // params.size() == spec().num_params.
  void Initialize(uint64_t seed, absl::Span<float> params) const;

  // Grows the device scratch to batches of `rows` examples (on the current
  // device; waits for it to go idle when it grows). InvalidArgument when
  // rows does not fit the int dimensions of cuBLAS.
  absl::Status Reserve(size_t rows);

  // Device API. d_params and d_grad: spec().num_params floats; d_features:
  // rows x spec().input_dim floats, row-major; d_labels: rows bytes, each
  // < num_classes (a larger one yields a NaN loss: the device cannot abort).
  // The model's device must be current on the calling thread.
  // Queues on `stream`: d_grad = d(mean loss)/d(params) (overwritten) and
  // *d_loss = the mean loss (one float in device memory). rows == 0 gives a
  // zero gradient and loss 0. d_grad must not alias the other inputs.
  absl::Status LossAndGradientDevice(const float* d_params,
                                     const float* d_features,
                                     const uint8_t* d_labels, size_t rows,
                                     float* d_grad, float* d_loss,
                                     cudaStream_t stream);
  // Queues *d_loss_sum = the summed loss and *d_correct = the correct top-1
  // predictions (ties go to the lowest class) over the rows; both in device
  // memory, both 0 for rows == 0.
  absl::Status EvaluateDevice(const float* d_params, const float* d_features,
                              const uint8_t* d_labels, size_t rows,
                              double* d_loss_sum,
                              unsigned long long* d_correct,
                              cudaStream_t stream);

 private:
  CudaModel(ModelSpec spec, const CudaModelOptions& options);

  absl::Status Init();
  // Runs the forward pass into pooled_ and activations_ (post-ReLU except
  // the last layer) and returns the logits.
  absl::StatusOr<const float*> Forward(const float* d_params,
                                       const float* d_features, size_t rows,
                                       cudaStream_t stream);
  // Conv stage s on StageInput(s) into pooled_[s] (post-ReLU) and
  // argmax_[s], group by group.
  absl::Status ConvStageForward(size_t s, const float* d_params,
                                const float* d_features, size_t rows,
                                cudaStream_t stream);
  // Given dy = dL/d(pooled_[s]) with the ReLU mask applied: the stage's
  // kernel and bias gradients into d_grad (overwritten) and, unless dx is
  // null, dL/d(StageInput(s)) into dx (before the mask of the stage below).
  absl::Status ConvStageBackward(size_t s, const float* d_params,
                                 const float* d_features, size_t rows,
                                 const float* dy, float* d_grad, float* dx,
                                 cudaStream_t stream);
  // The input of conv stage s: the features or the stage below's output.
  const float* StageInput(size_t s, const float* d_features) const;
  // The input of linear layer l: the features, the last conv stage's output
  // or the layer below's activation.
  const float* LayerInput(size_t l, const float* d_features) const;

  ModelSpec spec_;
  size_t max_width_ = 0;  // widest layer or stage input or output
  // Images per conv group, from CudaModelOptions; 0 without conv stages.
  size_t max_conv_group_ = 0;
  cublasHandle_t cublas_ = nullptr;

  size_t scratch_rows_ = 0;
  std::vector<DeviceBuffer<float>> activations_;  // one per layer
  std::vector<DeviceBuffer<float>> pooled_;       // one per conv stage
  std::vector<DeviceBuffer<uint8_t>> argmax_;     // one per conv stage
  // One group's im2col matrix (and, in backward, its gradient), and its
  // channel-major convolution output (in backward, that output's gradient).
  DeviceBuffer<float> cols_;
  DeviceBuffer<float> conv_out_;
  DeviceBuffer<float> grad_out_;  // d(loss)/d(activation), ping-pong
  DeviceBuffer<float> grad_in_;
  DeviceBuffer<double> row_loss_;
  DeviceBuffer<uint32_t> row_correct_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_CUDA_MODEL_H_
