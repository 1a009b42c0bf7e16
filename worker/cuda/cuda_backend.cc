#include "worker/cuda/cuda_backend.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::unique_ptr<CudaModel> model, uint32_t block_size, DeviceGroup* node_group) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(model)));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(backend->ops_,
                   CudaDeviceOps::Create(backend->model_->spec().num_params, block_size,
                                         backend->stream_, node_group));
  ASSIGN_OR_RETURN(backend->read_back_, ScalarReadBack::Allocate());
  return backend;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::ForJob(
    const v1::JobConfig& config, DeviceGroup* node_group) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model, CudaModel::Create(config.model()));
  return Create(std::move(model), config.algorithm().block_size(), node_group);
}

CudaBackend::~CudaBackend() {
  if (stream_ == nullptr) return;
  // Errors here can only repeat an earlier asynchronous fault.
  static_cast<void>(cudaStreamSynchronize(stream_));
  ops_.reset();
  // The model's cuBLAS handle is bound to the stream: destroyed first.
  model_.reset();
  static_cast<void>(cudaStreamDestroy(stream_));
}

absl::Status CudaBackend::Reserve(size_t rows) {
  if (rows <= max_rows_) return absl::OkStatus();
  // Nothing queued reads the old buffers once the stream is idle.
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const size_t dim = model_->spec().input_dim;
  RETURN_IF_ERROR(model_->Reserve(rows));
  ASSIGN_OR_RETURN(host_features_, PinnedBuffer<float>::Allocate(rows * dim));
  ASSIGN_OR_RETURN(host_labels_, PinnedBuffer<uint8_t>::Allocate(rows));
  ASSIGN_OR_RETURN(features_, DeviceBuffer<float>::Allocate(rows * dim));
  ASSIGN_OR_RETURN(labels_, DeviceBuffer<uint8_t>::Allocate(rows));
  max_rows_ = rows;
  return absl::OkStatus();
}

absl::Status CudaBackend::Upload(const Batch& batch) {
  RETURN_IF_ERROR(Reserve(batch.size));
  // The previous upload from the pinned buffers has run: every loss and
  // evaluation read-back, which follows its upload, waits for the stream.
  std::memcpy(host_features_.data(), batch.features.data(),
              batch.features.size() * sizeof(float));
  std::memcpy(host_labels_.data(), batch.labels.data(), batch.labels.size());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(features_.data(), host_features_.data(),
                                              batch.features.size() * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels_.data(), host_labels_.data(),
                                              batch.labels.size(), cudaMemcpyHostToDevice,
                                              stream_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaBackend::LossAndGradient(const float* params, const Batch& batch,
                                                   float* grad) {
  RETURN_IF_ERROR(Upload(batch));
  RETURN_IF_ERROR(model_->LossAndGradientDevice(params, features_.data(), labels_.data(),
                                                batch.size, grad, read_back_.loss(),
                                                stream_));
  return read_back_.Loss(stream_);
}

absl::StatusOr<EvalSums> CudaBackend::Evaluate(const float* params, const Batch& batch) {
  RETURN_IF_ERROR(Upload(batch));
  RETURN_IF_ERROR(model_->EvaluateDevice(params, features_.data(), labels_.data(),
                                         batch.size, read_back_.loss_sum(),
                                         read_back_.correct(), stream_));
  return read_back_.Sums(batch.size, stream_);
}

}  // namespace cserps
