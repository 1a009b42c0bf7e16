#include "worker/cuda/kernels/read_back.h"

#include "common/status.h"

namespace cserps {

absl::StatusOr<ScalarReadBack> ScalarReadBack::Allocate() {
  ScalarReadBack r;
  ASSIGN_OR_RETURN(r.loss_, DeviceBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(r.loss_sum_, DeviceBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(r.correct_, DeviceBuffer<unsigned long long>::Allocate(1));
  ASSIGN_OR_RETURN(r.host_loss_, PinnedBuffer<float>::Allocate(1));
  ASSIGN_OR_RETURN(r.host_loss_sum_, PinnedBuffer<double>::Allocate(1));
  ASSIGN_OR_RETURN(r.host_correct_, PinnedBuffer<unsigned long long>::Allocate(1));
  return r;
}

absl::StatusOr<float> ScalarReadBack::Loss(cudaStream_t stream) {
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_loss_.data(), loss_.data(), sizeof(float),
                                              cudaMemcpyDeviceToHost, stream));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return host_loss_.data()[0];
}

absl::StatusOr<EvalSums> ScalarReadBack::Sums(size_t count, cudaStream_t stream) {
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_loss_sum_.data(), loss_sum_.data(),
                                              sizeof(double), cudaMemcpyDeviceToHost,
                                              stream));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_correct_.data(), correct_.data(),
                                              sizeof(unsigned long long),
                                              cudaMemcpyDeviceToHost, stream));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  EvalSums sums;
  sums.loss_sum = host_loss_sum_.data()[0];
  sums.correct = static_cast<size_t>(host_correct_.data()[0]);
  sums.count = count;
  return sums;
}

}  // namespace cserps
