// Small host arguments handed to the device through page-locked memory (a
// cudaMemcpyAsync from pageable memory is not asynchronous): a device
// buffer, its pinned twin, and an event recorded after each copy from the
// twin. The block lists of CudaDeviceOps::FillBlocks and
// CudaStagingDevice::Gather and the entries of CudaDeviceOps::ScatterSparse
// go through one each.
//
// Upload may be called again at once: it first waits (cudaEventSynchronize)
// until the previous copy has left the twin, which it usually has. Memory is
// on the device current at Reserve. Neither copyable nor movable: a member
// of its owner. Not thread-safe.
#ifndef CSERPS_WORKER_CUDA_PINNED_UPLOAD_H_
#define CSERPS_WORKER_CUDA_PINNED_UPLOAD_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "worker/cuda/kernels/cuda_status.h"

namespace cserps {

template <typename T>
class PinnedUpload {
 public:
  PinnedUpload() = default;  // capacity 0
  // The event may still be pending: CUDA releases it once it has fired.
  ~PinnedUpload() {
    if (uploaded_ != nullptr) static_cast<void>(cudaEventDestroy(uploaded_));
  }
  PinnedUpload(const PinnedUpload&) = delete;
  PinnedUpload& operator=(const PinnedUpload&) = delete;

  size_t capacity() const { return std::min(device_.size(), pinned_.size()); }
  // The device copy of the last Upload, for work queued after it on its
  // stream; null while the capacity is 0.
  const T* data() const { return device_.data(); }

  // Room for `count` elements. Growing first waits for `stream`, on which
  // the uploads and the work that reads data() are queued, and frees the old
  // buffers. The CUDA error of an allocation or of creating the event.
  absl::Status Reserve(size_t count, cudaStream_t stream) {
    if (count <= capacity()) return absl::OkStatus();
    if (!device_.empty() || !pinned_.empty()) {
      CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      in_flight_ = false;
    }
    device_.Reset();
    pinned_.Reset();
    ASSIGN_OR_RETURN(device_, DeviceBuffer<T>::Allocate(count));
    ASSIGN_OR_RETURN(pinned_, PinnedBuffer<T>::Allocate(count));
    if (uploaded_ == nullptr) {
      CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
    }
    return absl::OkStatus();
  }

  // Queues on `stream` the copy of `host` (at most capacity() elements; more
  // is a programmer error and aborts) to data(). `host` may change once this
  // returns. An empty `host` queues nothing and does not wait.
  absl::Status Upload(absl::Span<const T> host, cudaStream_t stream) {
    CSERPS_CHECK(host.size() <= capacity());
    if (host.empty()) return absl::OkStatus();
    if (in_flight_) {
      CSERPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(uploaded_));
      in_flight_ = false;
    }
    const size_t bytes = host.size() * sizeof(T);
    std::memcpy(pinned_.data(), host.data(), bytes);
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device_.data(), pinned_.data(), bytes, cudaMemcpyHostToDevice, stream));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_, stream));
    in_flight_ = true;
    return absl::OkStatus();
  }

 private:
  DeviceBuffer<T> device_;
  PinnedBuffer<T> pinned_;
  cudaEvent_t uploaded_ = nullptr;  // created with the first buffers
  bool in_flight_ = false;          // a copy from pinned_ may still be queued
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_PINNED_UPLOAD_H_
