// DeviceOps (device_ops.h) in host memory: the CPU worker's, and what the
// GPU tests hold CudaDeviceOps to, bit for bit. Nothing is queued: every
// operation is done when it returns.
#ifndef CSERPS_WORKER_DEVICE_HOST_DEVICE_OPS_H_
#define CSERPS_WORKER_DEVICE_HOST_DEVICE_OPS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/device/device_ops.h"
#include "worker/group/local_group.h"

namespace cserps {

// The StagingDevice of HostDeviceOps: one model-sized vector that is both
// the staging and the host buffer (so the copies between them only check
// their ranges), and the collectives of `group` (may be null: a flat
// worker's) on it.
class HostStagingDevice final : public StagingDevice {
 public:
  // block_size > 0; `group`, when not null, outlives the device.
  HostStagingDevice(uint64_t num_params, uint32_t block_size, LocalGroup* group);

  uint64_t capacity() const override { return num_params_; }
  absl::Span<float> host() override { return absl::MakeSpan(staging_); }
  absl::Status Gather(const float* model, absl::Span<const uint64_t> blocks) override;
  absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) override;
  absl::Status WaitCopied(uint32_t) override { return absl::OkStatus(); }
  absl::Status CopyToStaging(uint64_t offset, uint64_t count) override;
  absl::Status Scatter(ScatterKind kind, float alpha, float* model) override;
  absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                            uint64_t count) override;
  absl::Status AllReduceStaging(uint64_t count) override;
  absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) override;

 private:
  uint64_t Begin(uint64_t block) const { return block * block_size_; }
  uint64_t End(uint64_t block) const {
    return std::min(num_params_, (block + 1) * block_size_);
  }
  // INVALID_ARGUMENT unless [offset, offset + count) is inside the staging,
  // as on the CUDA device, so that the CPU tests catch a bad range too.
  absl::Status CheckRange(absl::string_view what, uint64_t offset, uint64_t count) const;
  absl::Status NeedGroup(absl::string_view what) const;

  const uint64_t num_params_;
  const uint32_t block_size_;
  LocalGroup* const group_;  // null: no collectives
  std::vector<float> staging_;  // also the host buffer
  std::vector<uint64_t> blocks_;  // of the last Gather
};

class HostDeviceOps final : public DeviceOps {
 public:
  // block_size > 0.
  HostDeviceOps(uint64_t num_params, uint32_t block_size)
      : num_params_(num_params), block_size_(block_size) {}

  uint64_t num_params() const override { return num_params_; }
  uint32_t block_size() const override { return block_size_; }

  absl::StatusOr<DeviceVector> Allocate() override;
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
  const uint64_t num_params_;
  const uint32_t block_size_;
  std::vector<uint32_t> positions_;  // TopK's scratch
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_HOST_DEVICE_OPS_H_
