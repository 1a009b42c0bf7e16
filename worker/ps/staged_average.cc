#include "worker/ps/staged_average.h"

#include <string>
#include <utility>
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

// Copies `runs` down from the staging and pushes each as soon as it has
// landed: shard s is on the wire while s+1 is still copying down.
absl::Status Push(const std::vector<Run>& runs, ShardedAverage& round,
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
  return absl::OkStatus();
}

// Brings the means of `runs` back into the staging: shard s's reply moves
// up while s+1's is still awaited.
absl::Status Pull(const std::vector<Run>& runs, ShardedAverage& round,
                  StagingDevice& device) {
  for (const Run& run : runs) {
    RETURN_IF_ERROR(round.WaitShard(run.shard));
    RETURN_IF_ERROR(device.CopyToStaging(run.offset, run.count));
  }
  return absl::OkStatus();
}

// A flat worker's round: every run is this worker's.
class FlatRound final : public StagedRound {
 public:
  FlatRound(std::unique_ptr<ShardedAverage> round, StagingDevice& device,
            std::vector<Run> runs)
      : round_(std::move(round)), device_(device), runs_(std::move(runs)) {}

  absl::Status Land(ScatterKind kind, float alpha, float* target) override {
    RETURN_IF_ERROR(Pull(runs_, *round_, device_));
    return device_.Scatter(kind, alpha, target);
  }

 private:
  const std::unique_ptr<ShardedAverage> round_;
  StagingDevice& device_;
  const std::vector<Run> runs_;
};

// A local rank's part of its node's round: it pushed and pulls `mine`, and
// every run's mean comes from its owner.
class NodeRound final : public StagedRound {
 public:
  NodeRound(std::unique_ptr<ShardedAverage> round, StagingDevice& device,
            LocalGroup& group, std::vector<Run> runs, std::vector<Run> mine,
            absl::Status pushed, std::string what)
      : round_(std::move(round)),
        device_(device),
        group_(group),
        runs_(std::move(runs)),
        mine_(std::move(mine)),
        pushed_(std::move(pushed)),
        what_(std::move(what)) {}

  absl::Status Land(ScatterKind kind, float alpha, float* target) override {
    absl::Status status = pushed_;
    if (status.ok()) status = Pull(mine_, *round_, device_);
    RETURN_IF_ERROR(ShareStatus(group_, status, what_));
    for (const Run& run : runs_) {
      RETURN_IF_ERROR(
          device_.BroadcastStaging(run.shard % group_.size(), run.offset, run.count));
    }
    return device_.Scatter(kind, alpha, target);
  }

 private:
  const std::unique_ptr<ShardedAverage> round_;
  StagingDevice& device_;
  LocalGroup& group_;
  const std::vector<Run> runs_;
  const std::vector<Run> mine_;
  // A failure of this local rank's pushes, shared with its peers at Land:
  // they wait there for its shards' means.
  const absl::Status pushed_;
  const std::string what_;
};

absl::StatusOr<std::unique_ptr<StagedRound>> StartNode(const StagedAverageSpec& spec,
                                                       const std::vector<uint64_t>& blocks,
                                                       Staging plan, BeginRound begin_round,
                                                       StagingDevice& device,
                                                       const float* values) {
  LocalGroup& group = *spec.group;
  const uint32_t me = group.local_rank();
  std::vector<Run> mine;
  for (const Run& run : plan.runs) {
    if (run.shard % group.size() == me) mine.push_back(run);
  }
  std::string what = absl::StrCat("node average (step ", spec.step, ", stream ",
                                  v1::Stream_Name(spec.stream), ", ratio ", spec.ratio, ")");
  // A local rank that fails on its own says so before the next collective,
  // so that its peers do not wait there for it.
  absl::Status status = device.Gather(values, blocks);
  if (status.ok()) {
    status = device.ScaleStaging(StagingDevice::Scale::kMultiply, spec.weight, 0,
                                 plan.gathered);
  }
  RETURN_IF_ERROR(ShareStatus(group, status, what));
  // The node's sum of weight·values on the selected blocks, and its weight.
  float node_weight = spec.weight;
  RETURN_IF_ERROR(group.AllReduceSum(absl::MakeSpan(&node_weight, 1)));
  RETURN_IF_ERROR(device.AllReduceStaging(plan.gathered));
  // This local rank's shards, as the node's mean with the node's weight.
  std::unique_ptr<ShardedAverage> round = begin_round(node_weight);
  for (const Run& run : mine) {
    status.Update(CheckPayload(*round, run, spec.step));
    if (!status.ok()) break;
    status.Update(device.ScaleStaging(StagingDevice::Scale::kDivide, node_weight,
                                      run.offset, run.count));
  }
  if (status.ok()) status = Push(mine, *round, device);
  return std::make_unique<NodeRound>(std::move(round), device, group, std::move(plan.runs),
                                     std::move(mine), std::move(status), std::move(what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagedRound>> StartStagedAverage(
    const StagedAverageSpec& spec, BeginRound begin_round, StagingDevice& device,
    const float* values) {
  const BlockLayout& layout = *spec.layout;
  const std::vector<uint64_t> blocks =
      SelectBlocks(spec.job_seed, spec.stream, spec.step, spec.ratio, layout.num_blocks());
  ASSIGN_OR_RETURN(Staging plan, PlanStaging(layout, blocks, spec.step, device));
  if (spec.group != nullptr) {
    return StartNode(spec, blocks, std::move(plan), begin_round, device, values);
  }
  std::unique_ptr<ShardedAverage> round = begin_round(spec.weight);
  for (uint32_t s = 0, r = 0; s < layout.num_shards(); ++s) {
    const bool has_run = r < plan.runs.size() && plan.runs[r].shard == s;
    RETURN_IF_ERROR(
        CheckPayload(*round, has_run ? plan.runs[r++] : Run{s, 0, 0}, spec.step));
  }
  RETURN_IF_ERROR(device.Gather(values, blocks));
  RETURN_IF_ERROR(Push(plan.runs, *round, device));
  return std::make_unique<FlatRound>(std::move(round), device, std::move(plan.runs));
}

absl::Status StagedAverage(const StagedAverageSpec& spec, BeginRound begin_round,
                           StagingDevice& device, const float* values, ScatterKind kind,
                           float alpha, float* target) {
  ASSIGN_OR_RETURN(const std::unique_ptr<StagedRound> round,
                   StartStagedAverage(spec, begin_round, device, values));
  return round->Land(kind, alpha, target);
}

}  // namespace cserps
