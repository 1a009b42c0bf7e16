#include "worker/staged_average.h"

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

}  // namespace

absl::Status StagedAverage(const BlockLayout& layout, uint64_t job_seed,
                           v1::Stream stream, uint64_t step, uint32_t ratio,
                           ShardedAverage& round, StagingDevice& device,
                           const float* values, ScatterKind kind, float alpha,
                           float* target) {
  const std::vector<uint64_t> blocks =
      SelectBlocks(job_seed, stream, step, ratio, layout.num_blocks());
  // The selected blocks are ascending and each shard owns a contiguous block
  // range, so every shard's payload is one contiguous run of the staging.
  std::vector<Run> runs;
  uint64_t gathered = 0;
  size_t i = 0;
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    Run run{s, gathered, 0};
    for (; i < blocks.size() && blocks[i] < layout.ShardEndBlock(s); ++i) {
      run.count += layout.BlockEnd(blocks[i]) - layout.BlockBegin(blocks[i]);
    }
    gathered += run.count;
    if (run.count != round.payload_size(s)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "StagedAverage step ", step, " shard ", s, ": the round carries ",
          round.payload_size(s), " floats but the shard's selected blocks hold ",
          run.count, " (a client that covers only some shards?)"));
    }
    if (run.count > 0) runs.push_back(run);
  }
  if (gathered > device.capacity()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "StagedAverage step ", step, ": ", gathered,
        " selected floats exceed the staging capacity ", device.capacity()));
  }
  RETURN_IF_ERROR(device.Gather(values, blocks));
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
  return device.Scatter(kind, alpha, target);
}

}  // namespace cserps
