#include "worker/device/host_device_ops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/direction.h"
#include "common/status.h"
#include "worker/device/topk_select.h"

namespace cserps {

HostStagingDevice::HostStagingDevice(uint64_t num_params, uint32_t block_size,
                                     LocalGroup* group)
    : num_params_(num_params),
      block_size_(block_size),
      group_(group),
      staging_(num_params) {}

absl::Status HostStagingDevice::Gather(const float* model,
                                       absl::Span<const uint64_t> blocks) {
  blocks_.assign(blocks.begin(), blocks.end());
  float* out = staging_.data();
  for (uint64_t b : blocks_) out = std::copy(model + Begin(b), model + End(b), out);
  return absl::OkStatus();
}

absl::Status HostStagingDevice::CopyToHost(uint32_t, uint64_t offset, uint64_t count) {
  return CheckRange("CopyToHost", offset, count);
}

absl::Status HostStagingDevice::CopyToStaging(uint64_t offset, uint64_t count) {
  return CheckRange("CopyToStaging", offset, count);
}

absl::Status HostStagingDevice::Scatter(ScatterKind kind, float alpha, float* model) {
  const float* in = staging_.data();
  for (uint64_t b : blocks_) {
    for (uint64_t j = Begin(b); j < End(b); ++j, ++in) {
      model[j] = kind == ScatterKind::kAssign ? *in : model[j] + alpha * *in;
    }
  }
  return absl::OkStatus();
}

absl::Status HostStagingDevice::ScaleStaging(Scale op, float factor, uint64_t offset,
                                             uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("ScaleStaging"));
  RETURN_IF_ERROR(CheckRange("ScaleStaging", offset, count));
  for (float& v : absl::MakeSpan(staging_).subspan(offset, count)) {
    v = op == Scale::kMultiply ? v * factor : v / factor;
  }
  return absl::OkStatus();
}

absl::Status HostStagingDevice::AllReduceStaging(uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("AllReduceStaging"));
  RETURN_IF_ERROR(CheckRange("AllReduceStaging", 0, count));
  return group_->AllReduceSum(absl::MakeSpan(staging_).subspan(0, count));
}

absl::Status HostStagingDevice::BroadcastStaging(uint32_t root, uint64_t offset,
                                                 uint64_t count) {
  RETURN_IF_ERROR(NeedGroup("BroadcastStaging"));
  RETURN_IF_ERROR(CheckRange("BroadcastStaging", offset, count));
  return group_->Broadcast(root, absl::MakeSpan(staging_).subspan(offset, count));
}

absl::Status HostStagingDevice::CheckRange(absl::string_view what, uint64_t offset,
                                           uint64_t count) const {
  if (offset <= num_params_ && count <= num_params_ - offset) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("HostStagingDevice::", what, ": ", count,
                                                 " floats at offset ", offset,
                                                 " exceed the staging capacity ",
                                                 num_params_));
}

absl::Status HostStagingDevice::NeedGroup(absl::string_view what) const {
  if (group_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("HostStagingDevice::", what, ": the device has no local group"));
}

absl::StatusOr<DeviceVector> HostDeviceOps::Allocate() {
  return DeviceVector(new float[num_params_](), [](float* p) { delete[] p; });
}

absl::StatusOr<std::unique_ptr<StagingDevice>> HostDeviceOps::MakeStaging(
    LocalGroup* group) {
  return std::make_unique<HostStagingDevice>(num_params_, block_size_, group);
}

absl::Status HostDeviceOps::Upload(absl::Span<const float> host, float* dst) {
  if (host.size() != num_params_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostDeviceOps::Upload: ", host.size(), " floats, the buffers hold ", num_params_));
  }
  std::copy(host.begin(), host.end(), dst);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Download(const float* src, absl::Span<float> host) {
  if (host.size() != num_params_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "HostDeviceOps::Download: ", host.size(), " floats, the buffers hold ",
        num_params_));
  }
  std::copy_n(src, num_params_, host.begin());
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Copy(const float* src, float* dst) {
  std::copy_n(src, num_params_, dst);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Direction(const DirectionRule& rule, const float* g,
                                      const float* x, float* m, float* p) {
  ComputeDirection(rule, num_params_, g, x, m, p);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Descend(float lr, const float* p, float* x) {
  cserps::Descend(lr, num_params_, p, x);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::SgdStep(const DirectionRule& rule, float lr, const float* g,
                                    float* m, float* x) {
  // In runs that stay in the cache, so that both loops vectorise; each float
  // sees the operations of Direction then Descend, in their order.
  constexpr uint64_t kRun = 1024;
  float p[kRun];
  for (uint64_t begin = 0; begin < num_params_; begin += kRun) {
    const uint64_t n = std::min(kRun, num_params_ - begin);
    ComputeDirection(rule, n, g + begin, x + begin, m == nullptr ? nullptr : m + begin, p);
    cserps::Descend(lr, n, p, x + begin);
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ScaleAdd(float a, const float* p, const float* e, float* out) {
  for (uint64_t j = 0; j < num_params_; ++j) out[j] = a * p[j] + e[j];
  return absl::OkStatus();
}

absl::Status HostDeviceOps::AddDifference(const float* e, const float* a, const float* b,
                                          float* out) {
  for (uint64_t j = 0; j < num_params_; ++j) out[j] = e[j] + (a[j] - b[j]);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::FillBlocks(absl::Span<const uint64_t> blocks, float value,
                                       float* x) {
  for (uint64_t b : blocks) {
    const uint64_t begin = b * block_size_;
    std::fill(x + begin, x + std::min(num_params_, begin + block_size_), value);
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::Accumulate(float lr, float lambda, const float* g,
                                       const float* x, float* r) {
  for (uint64_t j = 0; j < num_params_; ++j) {
    const float p = g[j] + lambda * x[j];
    r[j] = r[j] + lr * p;
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::TopK(const float* values, absl::Span<const TopKRange> ranges,
                                 SparseVector* out) {
  out->indices.clear();
  out->values.clear();
  for (const TopKRange& range : ranges) {
    if (range.offset + range.size > num_params_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HostDeviceOps::TopK: range [", range.offset, ", ", range.offset + range.size,
          ") beyond the ", num_params_, " floats"));
    }
    SelectTopK(absl::MakeConstSpan(values + range.offset, range.size), range.k,
               &positions_);
    for (uint32_t pos : positions_) {
      out->indices.push_back(static_cast<uint32_t>(range.offset + pos));
      out->values.push_back(values[range.offset + pos]);
    }
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ScatterSparse(SparseOp op, absl::Span<const uint32_t> indices,
                                          absl::Span<const float> values, float divisor,
                                          float* x) {
  if (op != SparseOp::kZero && values.size() != indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("HostDeviceOps::ScatterSparse: ",
                                                   indices.size(), " indices but ",
                                                   values.size(), " values"));
  }
  for (size_t e = 0; e < indices.size(); ++e) {
    float& target = x[indices[e]];
    switch (op) {
      case SparseOp::kZero:
        target = 0.0f;
        break;
      case SparseOp::kAssignDivided:
        target = values[e] / divisor;
        break;
      case SparseOp::kSubtractDivided:
        target -= values[e] / divisor;
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ApplyMomentum(const DirectionRule& rule, const float* u,
                                          float* m, float* x) {
  if (!UsesMomentum(rule.kind)) {
    return absl::InvalidArgumentError(
        "HostDeviceOps::ApplyMomentum: the rule has no momentum");
  }
  ApplySharedMomentum(rule, num_params_, u, m, x);
  return absl::OkStatus();
}

}  // namespace cserps
