// Vector operations on the model-sized float buffers of one device: what
// the training algorithms (worker/algorithms/) are written with. Two
// implementations:
//   HostDeviceOps (host_device_ops.h): host memory and plain loops (the
//     CPU worker);
//   CudaDeviceOps (worker/cuda/cuda_device_ops.h): kernels on one CUDA
//     stream that round every product and sum as the host loops do (never
//     an FMA), so that both agree bit for bit (tests/gpu).
//
// Every float pointer is a buffer of num_params() floats from Allocate of
// the same ops. Operations are queued in order on the ops' one stream and
// may still be running when they return, except those that say they wait;
// host spans and vectors given to an operation are read before it returns.
// Errors are the device's (a failed launch or copy, naming it).
// Not thread-safe.
#ifndef CSERPS_WORKER_DEVICE_DEVICE_OPS_H_
#define CSERPS_WORKER_DEVICE_DEVICE_OPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/direction.h"
#include "common/sparse_vector.h"
#include "worker/group/local_group.h"
#include "worker/ps/staged_average.h"

namespace cserps {

// An owned buffer of a DeviceOps; released when it goes.
class DeviceVector {
 public:
  DeviceVector() = default;
  DeviceVector(float* data, std::function<void(float*)> release)
      : data_(data), release_(std::move(release)) {}
  DeviceVector(DeviceVector&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), release_(std::move(other.release_)) {}
  DeviceVector& operator=(DeviceVector&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      release_ = std::move(other.release_);
    }
    return *this;
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { Reset(); }

  float* data() const { return data_; }

 private:
  void Reset() {
    if (data_ != nullptr) release_(data_);
    data_ = nullptr;
  }

  float* data_ = nullptr;
  std::function<void(float*)> release_;
};

// One range of a TopK call: the k entries of values[offset, offset + size)
// with the largest |value|.
struct TopKRange {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t k = 0;
};

// What ScatterSparse writes at x[indices[e]].
enum class SparseOp {
  kZero,             // 0
  kAssignDivided,    // values[e] / divisor
  kSubtractDivided,  // x[indices[e]] − values[e] / divisor
};

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // The floats of every buffer, and the GRBS block size of the job.
  virtual uint64_t num_params() const = 0;
  virtual uint32_t block_size() const = 0;

  // A new buffer, zeroed.
  virtual absl::StatusOr<DeviceVector> Allocate() = 0;
  // A StagingDevice (worker/ps/staged_average.h) for averages of this ops'
  // buffers, ordered with the ops' own stream, whose collectives run on
  // `group` (null for a flat worker; it outlives the device). A group this
  // device cannot run collectives on is FAILED_PRECONDITION.
  virtual absl::StatusOr<std::unique_ptr<StagingDevice>> MakeStaging(LocalGroup* group) = 0;
  // dst = host (num_params() floats).
  virtual absl::Status Upload(absl::Span<const float> host, float* dst) = 0;
  // host = src (num_params() floats); waits for everything queued before.
  virtual absl::Status Download(const float* src, absl::Span<float> host) = 0;

  // dst = src.
  virtual absl::Status Copy(const float* src, float* dst) = 0;
  // p = Direction(g) at x (common/direction.h), advancing m (null for
  // NONE). p may alias g.
  virtual absl::Status Direction(const DirectionRule& rule, const float* g,
                                 const float* x, float* m, float* p) = 0;
  // x = x − lr·p.
  virtual absl::Status Descend(float lr, const float* p, float* x) = 0;
  // Direction then Descend without storing p (the weight decay reads x
  // before it moves): the same bits as the two.
  virtual absl::Status SgdStep(const DirectionRule& rule, float lr, const float* g,
                               float* m, float* x) = 0;
  // out = a·p + e (EF-SGD's a = η·p + e). out may alias e.
  virtual absl::Status ScaleAdd(float a, const float* p, const float* e, float* out) = 0;
  // out = e + (a − b) (QSparse's u = e + (x̂ − x)). out may alias e.
  virtual absl::Status AddDifference(const float* e, const float* a, const float* b,
                                     float* out) = 0;
  // x = value on the blocks `blocks` (ascending ids; block b is
  // [b·block_size, min(d, (b + 1)·block_size))).
  virtual absl::Status FillBlocks(absl::Span<const uint64_t> blocks, float value,
                                  float* x) = 0;
  // r = r + lr·(g + λ·x): the sparse methods' accumulator.
  virtual absl::Status Accumulate(float lr, float lambda, const float* g, const float* x,
                                  float* r) = 0;
  // For every range in order, the positions of its k entries with the
  // largest |value| as SelectTopK (worker/device/topk_select.h) chooses them,
  // appended to out->indices as global positions (offset + position,
  // ascending within the range) with their values in out->values. `out` is
  // cleared first. Waits. Every position must be below 2^32.
  virtual absl::Status TopK(const float* values, absl::Span<const TopKRange> ranges,
                            SparseVector* out) = 0;
  // x[indices[e]] as `op` says, for every e (indices distinct; values
  // ignored for kZero, else as many as indices).
  virtual absl::Status ScatterSparse(SparseOp op, absl::Span<const uint32_t> indices,
                                     absl::Span<const float> values, float divisor,
                                     float* x) = 0;
  // Momentum on an update u that every member shares (the sparse methods'
  // line 6): m = β·m + u; x = x − (NESTEROV ? u + β·m : m). rule.kind is
  // HEAVY_BALL or NESTEROV.
  virtual absl::Status ApplyMomentum(const DirectionRule& rule, const float* u, float* m,
                                     float* x) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_DEVICE_OPS_H_
