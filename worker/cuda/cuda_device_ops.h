// DeviceOps (worker/device/device_ops.h) on one CUDA stream: the kernels of
// update_kernels.h, vector_kernels.h, block_gather.h and topk.h, which round
// as the host loops do, so that the results match HostDeviceOps bit for bit
// (tests/gpu/device_ops_test.cc).
//
// Where the host waits (every other operation only queues on the stream):
//   Upload, Download   cudaStreamSynchronize after the copy through the
//                      internal pinned buffer, which is then free again and
//                      the host span is no longer needed;
//   TopK               cudaStreamSynchronize before reading the selection;
//   FillBlocks, ScatterSparse
//                      their host arguments go through pinned buffers
//                      (worker/cuda/pinned_upload.h); the next call that
//                      rewrites those buffers first waits
//                      (cudaEventSynchronize) for the previous upload from
//                      them, which the stream has usually run by then;
//   growing an internal buffer (TopK, ScatterSparse with more entries than
//                      before) synchronises the stream before the old one
//                      is freed;
//   a DeviceVector's release (cudaFree) and the destructor wait for the
//                      whole device.
// Allocation happens in Create, Allocate, MakeStaging, and when TopK or
// ScatterSparse first need a larger internal buffer; never otherwise.
//
// The device that was current at Create must be current on the calling
// thread. Errors: INVALID_ARGUMENT for host spans of the wrong size, block
// ids, indices or ranges outside the model; the CUDA error of a failed
// launch, copy or allocation, naming the call (worker/cuda/kernels/cuda_status.h).
// Not thread-safe.
#ifndef CSERPS_WORKER_CUDA_CUDA_DEVICE_OPS_H_
#define CSERPS_WORKER_CUDA_CUDA_DEVICE_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cuda/device_group.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/pinned_upload.h"
#include "worker/device/device_ops.h"

namespace cserps {

class CudaDeviceOps final : public DeviceOps {
 public:
  // Ops on buffers of `num_params` floats in GRBS blocks of `block_size`,
  // queued on `stream` (not owned; it outlives the ops and every
  // DeviceVector and StagingDevice they made). `node_group`: the device
  // side of this process's node group (NcclGroup, worker/cuda/nccl_group.h;
  // it outlives the ops), or null for a flat worker. INVALID_ARGUMENT for
  // block_size 0; the CUDA error of an allocation.
  static absl::StatusOr<std::unique_ptr<CudaDeviceOps>> Create(
      uint64_t num_params, uint32_t block_size, cudaStream_t stream,
      DeviceGroup* node_group = nullptr);
  // Waits for the stream, then frees the internal buffers.
  ~CudaDeviceOps() override;

  uint64_t num_params() const override { return num_params_; }
  uint32_t block_size() const override { return block_size_; }
  // The stream every operation is queued on.
  cudaStream_t stream() const { return stream_; }

  // The DeviceVector's release calls cudaFree, which waits for the device.
  absl::StatusOr<DeviceVector> Allocate() override;
  // A CudaStagingDevice (worker/cuda/cuda_staging.h) on this ops' stream.
  // For a node (`group` not null), its collectives run on the staging
  // buffer through the ops' node group, which must be `group`'s device side;
  // FAILED_PRECONDITION when the ops were made without one.
  absl::StatusOr<std::unique_ptr<StagingDevice>> MakeStaging(LocalGroup* group) override;
  absl::Status Upload(absl::Span<const float> host, float* dst) override;
  absl::Status Download(const float* src, absl::Span<float> host) override;

  absl::Status Copy(const float* src, float* dst) override;
  absl::Status Direction(const DirectionRule& rule, const float* g, const float* x,
                         float* m, float* p) override;
  absl::Status Descend(float lr, const float* p, float* x) override;
  absl::Status SgdStep(const DirectionRule& rule, float lr, const float* g, float* m,
                       float* x) override;
  absl::Status ScaleAdd(float a, const float* p, const float* e, float* out) override;
  absl::Status AddDifference(const float* e, const float* a, const float* b,
                             float* out) override;
  absl::Status FillBlocks(absl::Span<const uint64_t> blocks, float value,
                          float* x) override;
  absl::Status Accumulate(float lr, float lambda, const float* g, const float* x,
                          float* r) override;
  absl::Status TopK(const float* values, absl::Span<const TopKRange> ranges,
                    SparseVector* out) override;
  absl::Status ScatterSparse(SparseOp op, absl::Span<const uint32_t> indices,
                             absl::Span<const float> values, float divisor,
                             float* x) override;
  absl::Status ApplyMomentum(const DirectionRule& rule, const float* u, float* m,
                             float* x) override;

 private:
  CudaDeviceOps(uint64_t num_params, uint32_t block_size, cudaStream_t stream,
                DeviceGroup* node_group)
      : num_params_(num_params),
        block_size_(block_size),
        stream_(stream),
        node_group_(node_group) {}

  // Makes `buffer` hold at least `count` elements, synchronising the stream
  // before an old buffer that queued work may use is freed.
  template <typename Buffer>
  absl::Status Reserve(Buffer& buffer, size_t count);

  const uint64_t num_params_;
  const uint32_t block_size_;
  cudaStream_t stream_;
  DeviceGroup* const node_group_;  // null: a flat worker's ops
  PinnedBuffer<float> host_;  // Upload and Download, num_params floats
  // FillBlocks' block ids: capacity for every block of the model.
  PinnedUpload<uint64_t> blocks_;
  // ScatterSparse's entries, grown on demand.
  PinnedUpload<uint32_t> sparse_indices_;
  PinnedUpload<float> sparse_values_;
  // TopK's workspace and selection, grown on demand.
  DeviceBuffer<unsigned char> topk_workspace_;
  DeviceBuffer<uint32_t> topk_positions_;
  DeviceBuffer<float> topk_values_;
  PinnedBuffer<uint32_t> host_topk_positions_;
  PinnedBuffer<float> host_topk_values_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_CUDA_DEVICE_OPS_H_
