// The CUDA StagingDevice (worker/staged_average.h): a device staging buffer
// and a pinned host buffer of model size, the block list on the device, one
// copy stream, and one event per shard.
//
// Gather and Scatter run on the caller's compute stream, so they are
// ordered with the algorithm's kernels; the copies run on the copy stream,
// which waits (cudaStreamWaitEvent) for the gather, and the compute stream
// waits for the last copy back before the scatter. Nothing here blocks the
// host except WaitCopied (cudaEventSynchronize on the shard's event).
// Every CUDA error is a Status naming the call (worker/cuda/cuda_status.h).
//
// Rounds may follow one another without synchronising: the next round's
// copies are queued after the previous round's on the copy stream, and its
// gather after the previous scatter on the compute stream. The device that
// was current at Create must be current on the calling thread. Not
// thread-safe.
#ifndef CSERPS_WORKER_CUDA_CUDA_STAGING_H_
#define CSERPS_WORKER_CUDA_CUDA_STAGING_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_status.h"
#include "worker/staged_average.h"

namespace cserps {

class CudaStagingDevice final : public StagingDevice {
 public:
  // Buffers for a model of `num_params` floats in blocks of `block_size`;
  // `compute` (not owned, outlives this) is the stream of the model and the
  // algorithm. INVALID_ARGUMENT for block_size 0; the CUDA error of an
  // allocation or of creating the stream or events.
  static absl::StatusOr<std::unique_ptr<CudaStagingDevice>> Create(
      uint64_t num_params, uint32_t block_size, cudaStream_t compute);
  // Waits for the queued copies, then frees everything.
  ~CudaStagingDevice() override;

  uint64_t capacity() const override { return num_params_; }
  absl::Span<float> host() override { return host_.span(); }
  absl::Status Gather(const float* model, absl::Span<const uint64_t> blocks) override;
  absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) override;
  absl::Status WaitCopied(uint32_t slot) override;
  absl::Status CopyToStaging(uint64_t offset, uint64_t count) override;
  absl::Status Scatter(ScatterKind kind, float alpha, float* model) override;
  // A node's operations: not on the device yet (nodes of several GPUs run
  // the host-span path, docs/gpu.md); FAILED_PRECONDITION.
  absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                            uint64_t count) override;
  absl::Status AllReduceStaging(uint64_t count) override;
  absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) override;

 private:
  CudaStagingDevice(uint64_t num_params, uint32_t block_size, cudaStream_t compute)
      : num_params_(num_params), block_size_(block_size), compute_(compute) {}

  const uint64_t num_params_;
  const uint32_t block_size_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  DeviceBuffer<float> staging_;
  PinnedBuffer<float> host_;
  DeviceBuffer<uint64_t> blocks_;
  PinnedBuffer<uint64_t> host_blocks_;
  uint64_t num_selected_ = 0;
  // host_blocks_ may be rewritten once its upload has run.
  cudaEvent_t blocks_uploaded_ = nullptr;
  bool blocks_in_flight_ = false;
  cudaEvent_t gathered_ = nullptr;  // compute → copy stream
  cudaEvent_t returned_ = nullptr;  // copy → compute stream
  std::vector<cudaEvent_t> copied_;  // by slot, created on first use
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_CUDA_STAGING_H_
