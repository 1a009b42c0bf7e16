#include "worker/staged_average.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grbs.h"
#include "common/status.h"

namespace cserps {
namespace {

// Where one shard's payload sits in the staging buffer.
struct Run {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
};

// The non-empty runs of the shards of the selection `blocks`, in shard
// order, and the floats gathered in all. The selected blocks are ascending
// and each shard owns a contiguous block range, so every shard's payload is
// one contiguous run of the staging.
struct Staging {
  std::vector<Run> runs;
  uint64_t gathered = 0;
};

absl::StatusOr<Staging> PlanStaging(const BlockLayout& layout,
                                    const std::vector<uint64_t>& blocks, uint64_t step,
                                    const StagingDevice& device) {
  Staging plan;
  size_t i = 0;
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    Run run{s, plan.gathered, 0};
    for (; i < blocks.size() && blocks[i] < layout.ShardEndBlock(s); ++i) {
      run.count += layout.BlockEnd(blocks[i]) - layout.BlockBegin(blocks[i]);
    }
    plan.gathered += run.count;
    if (run.count > 0) plan.runs.push_back(run);
  }
  if (plan.gathered > device.capacity()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "StagedAverage step ", step, ": ", plan.gathered,
        " selected floats exceed the staging capacity ", device.capacity()));
  }
  return plan;
}

absl::Status CheckPayload(const ShardedAverage& round, const Run& run, uint64_t step) {
  if (run.count == round.payload_size(run.shard)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "StagedAverage step ", step, " shard ", run.shard, ": the round carries ",
      round.payload_size(run.shard), " floats but the shard's selected blocks hold ",
      run.count, " (a client that covers other shards?)"));
}

// Pushes `runs` from the staging and brings their means back into it:
// shard s is on the wire while s+1 is still copying down, and its reply
// moves up while s+1's is still awaited.
absl::Status Exchange(const std::vector<Run>& runs, ShardedAverage& round,
                      StagingDevice& device) {
  for (const Run& run : runs) {
    RETURN_IF_ERROR(device.CopyToHost(run.shard, run.offset, run.count));
  }
  const absl::Span<float> host = device.host();
  for (const Run& run : runs) {
    RETURN_IF_ERROR(device.WaitCopied(run.shard));
    // The reply overwrites the request's floats: the request was serialized
    // before StartShard returned.
    const absl::Span<float> floats = host.subspan(run.offset, run.count);
    RETURN_IF_ERROR(round.StartShard(run.shard, floats, floats));
  }
  for (const Run& run : runs) {
    RETURN_IF_ERROR(round.WaitShard(run.shard));
    RETURN_IF_ERROR(device.CopyToStaging(run.offset, run.count));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StagedAverage(const BlockLayout& layout, uint64_t job_seed,
                           v1::Stream stream, uint64_t step, uint32_t ratio,
                           ShardedAverage& round, StagingDevice& device,
                           const float* values, ScatterKind kind, float alpha,
                           float* target) {
  const std::vector<uint64_t> blocks =
      SelectBlocks(job_seed, stream, step, ratio, layout.num_blocks());
  ASSIGN_OR_RETURN(const Staging plan, PlanStaging(layout, blocks, step, device));
  for (uint32_t s = 0, r = 0; s < layout.num_shards(); ++s) {
    const bool has_run = r < plan.runs.size() && plan.runs[r].shard == s;
    RETURN_IF_ERROR(CheckPayload(round, has_run ? plan.runs[r++] : Run{s, 0, 0}, step));
  }
  RETURN_IF_ERROR(device.Gather(values, blocks));
  RETURN_IF_ERROR(Exchange(plan.runs, round, device));
  return device.Scatter(kind, alpha, target);
}

absl::Status NodeStagedAverage(
    const BlockLayout& layout, uint64_t job_seed, v1::Stream stream, uint64_t step,
    uint32_t ratio, LocalGroup& group, float weight,
    absl::FunctionRef<std::unique_ptr<ShardedAverage>(float node_weight)> begin_round,
    StagingDevice& device, const float* values, ScatterKind kind, float alpha,
    float* target) {
  const std::vector<uint64_t> blocks =
      SelectBlocks(job_seed, stream, step, ratio, layout.num_blocks());
  ASSIGN_OR_RETURN(const Staging plan, PlanStaging(layout, blocks, step, device));
  const uint32_t me = group.local_rank();
  std::vector<Run> mine;
  for (const Run& run : plan.runs) {
    if (run.shard % group.size() == me) mine.push_back(run);
  }
  const std::string what = absl::StrCat("node average (step ", step, ", stream ",
                                        v1::Stream_Name(stream), ", ratio ", ratio, ")");
  // A local rank that fails on its own says so before the next collective,
  // so that its peers do not wait there for it.
  absl::Status status = device.Gather(values, blocks);
  if (status.ok()) {
    status = device.ScaleStaging(StagingDevice::Scale::kMultiply, weight, 0, plan.gathered);
  }
  RETURN_IF_ERROR(ShareStatus(group, status, what));
  // The node's sum of weight·values on the selected blocks, and its weight.
  float node_weight = weight;
  RETURN_IF_ERROR(group.AllReduceSum(absl::MakeSpan(&node_weight, 1)));
  RETURN_IF_ERROR(device.AllReduceStaging(plan.gathered));
  // This local rank's shards, as the node's mean with the node's weight.
  const std::unique_ptr<ShardedAverage> round = begin_round(node_weight);
  for (const Run& run : mine) {
    status.Update(CheckPayload(*round, run, step));
    if (!status.ok()) break;
    status.Update(device.ScaleStaging(StagingDevice::Scale::kDivide, node_weight,
                                      run.offset, run.count));
  }
  if (status.ok()) status = Exchange(mine, *round, device);
  RETURN_IF_ERROR(ShareStatus(group, status, what));
  for (const Run& run : plan.runs) {
    RETURN_IF_ERROR(device.BroadcastStaging(run.shard % group.size(), run.offset, run.count));
  }
  return device.Scatter(kind, alpha, target);
}

}  // namespace cserps
