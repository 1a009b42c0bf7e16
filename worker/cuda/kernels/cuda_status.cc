#include "worker/cuda/kernels/cuda_status.h"

namespace cserps {
namespace {

absl::StatusCode CudaCode(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CublasCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

namespace internal {

absl::Status CallFailedStatus(absl::StatusCode code, absl::string_view call,
                              const char* file, int line, absl::string_view detail) {
  return absl::Status(code, absl::StrCat(call, " failed at ", file, ":", line, ": ", detail));
}

}  // namespace internal

absl::Status CudaStatus(cudaError_t error, absl::string_view call,
                        const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  return internal::CallFailedStatus(
      CudaCode(error), call, file, line,
      absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view call,
                          const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return internal::CallFailedStatus(
      CublasCode(status), call, file, line,
      absl::StrCat(cublasGetStatusName(status), ": ", cublasGetStatusString(status)));
}

absl::Status CudaLaunchStatus(absl::string_view kernel, const char* file,
                              int line) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, absl::StrCat("launch of ", kernel), file, line);
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // Clears the error so that it does not surface in a later, unrelated
    // CudaLaunchStatus.
    static_cast<void>(cudaGetLastError());
    return 0;
  }
  return count;
}

}  // namespace cserps
