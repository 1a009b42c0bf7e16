// Helpers shared by the GPU tests: the skip when no device is present, Status
// assertions, host <-> device copies and a stream.
#ifndef CSERPS_TESTS_GPU_GPU_TEST_UTIL_H_
#define CSERPS_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "worker/cuda/kernels/cuda_status.h"

// First statement of every test that needs a device. ctest turns the
// "[  SKIPPED ]" this prints into a Skipped result (tests/gpu/CMakeLists.txt),
// and tools/gpu_check.sh fails on a skip where a GPU is present.
#define CSERPS_SKIP_WITHOUT_GPU()                                  \
  do {                                                             \
    if (::cserps::CudaDeviceCount() == 0) {                        \
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount)";       \
    }                                                              \
  } while (0)

#define CSERPS_ASSERT_OK(expr)                       \
  do {                                               \
    const ::absl::Status cserps_test_status_ = (expr); \
    ASSERT_TRUE(cserps_test_status_.ok()) << cserps_test_status_; \
  } while (0)

#define CSERPS_ASSERT_OK_AND_ASSIGN(lhs, expr)                              \
  CSERPS_ASSERT_OK_AND_ASSIGN_IMPL_(                                        \
      CSERPS_CONCAT_(cserps_test_statusor_, __LINE__), lhs, expr)
#define CSERPS_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.ok()) << tmp.status();                  \
  lhs = std::move(tmp).value()

namespace cserps {

// A non-blocking CUDA stream for one test, destroyed with it; get() is null
// when it could not be created.
class TestStream {
 public:
  TestStream() {
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
      stream_ = nullptr;
    }
  }
  ~TestStream() {
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A device copy of `host`, complete when this returns: a cudaMemcpy from
// pageable memory may return before the copy has landed, and work on a
// non-blocking stream is not ordered after it.
template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(absl::Span<const T> host) {
  ASSIGN_OR_RETURN(DeviceBuffer<T> device, DeviceBuffer<T>::Allocate(host.size()));
  if (!host.empty()) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), host.data(),
                                           host.size() * sizeof(T),
                                           cudaMemcpyHostToDevice));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  }
  return device;
}

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
  return Upload(absl::MakeConstSpan(host));
}

// The first `count` elements of `device`, after the device has finished
// everything queued so far (so a kernel fault is reported here).
template <typename T>
absl::StatusOr<std::vector<T>> Download(const T* device, size_t count) {
  CSERPS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  std::vector<T> host(count);
  if (count > 0) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), device,
                                           count * sizeof(T),
                                           cudaMemcpyDeviceToHost));
  }
  return host;
}

}  // namespace cserps

#endif  // CSERPS_TESTS_GPU_GPU_TEST_UTIL_H_
