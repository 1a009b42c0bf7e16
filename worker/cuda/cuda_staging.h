// The CUDA StagingDevice (worker/ps/staged_average.h): a device staging buffer
// and a pinned host buffer of model size, the block list on the device, one
// copy stream, and one event per shard; for a node of GPUs, the local
// group's device collectives (worker/cuda/device_group.h).
//
// Stream ordering. Gather, ScaleStaging and Scatter run on the caller's
// compute stream, so they are ordered with the algorithm's kernels; the
// group's collectives are ordered after the compute stream and complete
// before they return. The copies (CopyToHost, CopyToStaging) run on the
// copy stream. The two streams hand the staging buffer over by events, at
// the first operation of one stream after work was queued on the other:
//   - a copy waits for the compute stream as it stood then (the gather, and
//     for a node the scaling and the all-reduce behind it), recorded when
//     the first copy after compute work is queued, not at the gather;
//   - a compute-stream operation or collective (the next gather, a
//     broadcast, the scatter) waits for the copies queued before it (the
//     replies' copy-backs).
// So in a flat round all shards' copies down are queued behind one wait
// and overlap the wire, and in a node's round the copies down follow the
// division by the node weight and each broadcast follows the copy-backs.
// Nothing here blocks the host except WaitCopied (cudaEventSynchronize on
// the shard's event), the group's collectives, and a Gather that finds the
// previous round's block list still being uploaded (pinned_upload.h). Every
// CUDA error is a Status naming the call (worker/cuda/kernels/cuda_status.h).
//
// Rounds may follow one another without synchronising: the next round's
// copies are queued after the previous round's on the copy stream, and its
// gather after the previous round's copies and scatter. The device that
// was current at Create must be current on the calling thread. Not
// thread-safe.
#ifndef CSERPS_WORKER_CUDA_CUDA_STAGING_H_
#define CSERPS_WORKER_CUDA_CUDA_STAGING_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/cuda/cuda_device_ops.h"
#include "worker/cuda/device_group.h"
#include "worker/cuda/kernels/block_gather.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/pinned_upload.h"
#include "worker/ps/staged_average.h"

namespace cserps {

class CudaStagingDevice final : public StagingDevice {
 public:
  // The staging of averages of `ops`' buffers (made by its MakeStaging),
  // ordered with its stream, the compute stream of the model and the
  // algorithm. `group` (not owned, outlives this; null for a flat worker)
  // is the node's group on this device, for a node's staged average. The
  // CUDA error of an allocation or of creating the stream or events.
  static absl::StatusOr<std::unique_ptr<CudaStagingDevice>> Create(const CudaDeviceOps& ops,
                                                                   DeviceGroup* group);
  // Waits for the queued copies, then frees everything.
  ~CudaStagingDevice() override;

  uint64_t capacity() const override { return num_params_; }
  absl::Span<float> host() override { return host_.span(); }
  absl::Status Gather(const float* model, absl::Span<const uint64_t> blocks) override;
  absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) override;
  absl::Status WaitCopied(uint32_t slot) override;
  absl::Status CopyToStaging(uint64_t offset, uint64_t count) override;
  absl::Status Scatter(ScatterKind kind, float alpha, float* model) override;
  // A node's operations: FAILED_PRECONDITION naming the operation on a
  // device made without a group; INVALID_ARGUMENT for a range past the
  // capacity; the group's errors (DeviceGroup).
  absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                            uint64_t count) override;
  absl::Status AllReduceStaging(uint64_t count) override;
  absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) override;

 private:
  CudaStagingDevice(uint64_t num_params, uint32_t block_size, cudaStream_t compute,
                    DeviceGroup* group)
      : num_params_(num_params),
        block_size_(block_size),
        compute_(compute),
        group_(group) {}

  // The hand-overs of the staging buffer between the streams (see the
  // file comment): each is a no-op unless the other stream has queued
  // work since the last one.
  absl::Status CopyAfterCompute();
  absl::Status ComputeAfterCopies();
  absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t count) const;
  absl::Status NeedGroup(absl::string_view what) const;
  // The blocks of the last Gather, on the device.
  cuda::BlockList Selected() const {
    return {num_params_, block_size_, blocks_.data(), num_selected_};
  }

  const uint64_t num_params_;
  const uint32_t block_size_;
  cudaStream_t compute_;
  DeviceGroup* const group_;  // null: no collectives
  cudaStream_t copy_ = nullptr;
  DeviceBuffer<float> staging_;
  PinnedBuffer<float> host_;
  PinnedUpload<uint64_t> blocks_;  // capacity for every block of the model
  uint64_t num_selected_ = 0;
  cudaEvent_t computed_ = nullptr;  // compute → copy stream
  cudaEvent_t returned_ = nullptr;  // copy → compute stream
  // Work was queued on that stream since the other last waited for it.
  bool compute_pending_ = false;
  bool copies_pending_ = false;
  std::vector<cudaEvent_t> copied_;  // by slot, created on first use
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_CUDA_STAGING_H_
