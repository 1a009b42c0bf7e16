// CUDA and cuBLAS errors as absl::Status, and RAII owners of device and
// pinned host memory.
//
// Every CUDA runtime and cuBLAS call of the backend goes through
// CSERPS_CUDA_RETURN_IF_ERROR / CSERPS_CUBLAS_RETURN_IF_ERROR, which return
// a Status naming the call, the file and the line (nccl-tests' CUDACHECK, but
// returning instead of exiting); NCCL's CSERPS_NCCL_RETURN_IF_ERROR
// (worker/cuda/nccl_group.h) is one of the family. Kernel launches are
// followed by CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED(name), which reads
// cudaGetLastError().
//
// Codes: an allocation failure is RESOURCE_EXHAUSTED; no device, no usable
// driver or an uninitialised cuBLAS is FAILED_PRECONDITION; everything else
// (a faulting kernel, a bad launch configuration) is INTERNAL.
#ifndef CSERPS_WORKER_CUDA_KERNELS_CUDA_STATUS_H_
#define CSERPS_WORKER_CUDA_KERNELS_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status.h"

namespace cserps {

// "<call> failed at <file>:<line>: <error name>: <error string>"; OK for
// cudaSuccess / CUBLAS_STATUS_SUCCESS.
absl::Status CudaStatus(cudaError_t error, absl::string_view call,
                        const char* file, int line);
absl::Status CublasStatus(cublasStatus_t status, absl::string_view call,
                          const char* file, int line);
// The error of the most recent kernel launch on this thread (cleared by
// reading it), as a Status naming `kernel`.
absl::Status CudaLaunchStatus(absl::string_view kernel, const char* file,
                              int line);

// Number of CUDA devices visible to this process: 0 when the driver or the
// device is missing (the reason is not an error for callers that only ask
// whether to use a GPU).
int CudaDeviceCount();

namespace internal {

// `code` with "<call> failed at <file>:<line>: <detail>": the message of
// every CUDA, cuBLAS and NCCL error above and in NcclStatus.
absl::Status CallFailedStatus(absl::StatusCode code, absl::string_view call,
                              const char* file, int line, absl::string_view detail);

}  // namespace internal
}  // namespace cserps

// Each returns from the enclosing function the Status of `call`'s result
// unless it is OK, with the call's text and the file and line of the macro.
#define CSERPS_CUDA_RETURN_IF_ERROR(call) \
  RETURN_IF_ERROR(::cserps::CudaStatus((call), #call, __FILE__, __LINE__))
#define CSERPS_CUBLAS_RETURN_IF_ERROR(call) \
  RETURN_IF_ERROR(::cserps::CublasStatus((call), #call, __FILE__, __LINE__))
#define CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED(kernel) \
  RETURN_IF_ERROR(::cserps::CudaLaunchStatus(kernel, __FILE__, __LINE__))

namespace cserps {

namespace internal {

// Where a CudaBuffer's memory comes from.
struct DeviceMemory {
  static constexpr const char* kBuffer = "DeviceBuffer";
  static constexpr const char* kAllocate = "cudaMalloc";
  static constexpr bool kHostAccessible = false;
  static cudaError_t Allocate(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void Free(void* p) { static_cast<void>(cudaFree(p)); }
};
struct PinnedMemory {
  static constexpr const char* kBuffer = "PinnedBuffer";
  static constexpr const char* kAllocate = "cudaMallocHost";
  static constexpr bool kHostAccessible = true;
  static cudaError_t Allocate(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void Free(void* p) { static_cast<void>(cudaFreeHost(p)); }
};

// `count` elements of T from `Memory`, freed on destruction. Move-only. The
// contents start uninitialised. Freeing waits for the device to go idle: do
// not let buffers die on a hot path.
template <typename T, typename Memory>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  ~CudaBuffer() { Reset(); }
  CudaBuffer(CudaBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  // Device memory is allocated on the current device. count == 0 gives an
  // empty buffer (null data()).
  static absl::StatusOr<CudaBuffer> Allocate(size_t count) {
    CudaBuffer buffer;
    if (count == 0) return buffer;
    if (count > std::numeric_limits<size_t>::max() / sizeof(T)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Memory::kBuffer, ": ", count, " elements of ", sizeof(T),
                       " bytes overflow size_t"));
    }
    void* p = nullptr;
    const cudaError_t error = Memory::Allocate(&p, count * sizeof(T));
    if (error != cudaSuccess) {
      return CudaStatus(error,
                        absl::StrCat(Memory::kAllocate, "(", count * sizeof(T), " bytes)"),
                        __FILE__, __LINE__);
    }
    buffer.data_ = static_cast<T*>(p);
    buffer.size_ = count;
    return buffer;
  }

  T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  // Only host-accessible memory can be read through a span.
  template <typename M = Memory, typename = std::enable_if_t<M::kHostAccessible>>
  absl::Span<T> span() const {
    return absl::Span<T>(data_, size_);
  }

  // Frees the memory; the buffer becomes empty. The free's error is dropped:
  // it can only report an earlier asynchronous fault, which the next checked
  // call reports again.
  void Reset() {
    if (data_ != nullptr) Memory::Free(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace internal

// Device memory (cudaMalloc).
template <typename T>
using DeviceBuffer = internal::CudaBuffer<T, internal::DeviceMemory>;
// Page-locked host memory (cudaMallocHost), so that cudaMemcpyAsync to and
// from it is truly asynchronous.
template <typename T>
using PinnedBuffer = internal::CudaBuffer<T, internal::PinnedMemory>;

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_CUDA_STATUS_H_
