#include "worker/ps/node_client.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

absl::Duration NodeGroupTimeout(const v1::JobConfig& config, const PsClientOptions& client) {
  const absl::Duration round =
      absl::Seconds(config.cluster().round_timeout_s()) + client.rpc_slack;
  return std::max(round, client.setup_timeout) + absl::Seconds(30);
}

std::vector<uint32_t> GroupShards(uint32_t num_shards, uint32_t local_size,
                                  uint32_t local_rank) {
  std::vector<uint32_t> shards;
  for (uint32_t s = local_rank; s < num_shards; s += local_size) shards.push_back(s);
  return shards;
}

namespace {

// Local rank 0's `*step` to every local rank, in 16-bit pieces, which
// floats hold exactly.
absl::Status BroadcastStep(LocalGroup& group, uint64_t* step) {
  float pieces[4];
  for (int i = 0; i < 4; ++i) pieces[i] = static_cast<float>((*step >> (16 * i)) & 0xffff);
  RETURN_IF_ERROR(group.Broadcast(0, absl::MakeSpan(pieces)));
  *step = 0;
  for (int i = 0; i < 4; ++i) *step |= static_cast<uint64_t>(pieces[i]) << (16 * i);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> RegisterNode(LocalGroup& group, PsClient& client,
                                      int requested_rank, const std::string& node_id) {
  const std::string what = absl::StrCat("RegisterNode of \"", node_id, "\"");
  // Local rank 0 owns shard 0, which assigns the rank; the others then ask
  // for that rank, so every shard knows the node under one rank.
  absl::StatusOr<uint32_t> rank = absl::UnknownError("not registered yet");
  if (group.local_rank() == 0) rank = client.Register(requested_rank, node_id);
  RETURN_IF_ERROR(ShareStatus(group, group.local_rank() == 0 ? rank.status()
                                                             : absl::OkStatus(),
                              what));
  // A rank fits a float exactly: ranks are below 2^24 in any real job.
  float shared = group.local_rank() == 0 ? static_cast<float>(*rank) : 0.0f;
  RETURN_IF_ERROR(group.Broadcast(0, absl::MakeSpan(&shared, 1)));
  if (group.local_rank() != 0) {
    rank = client.Register(static_cast<int>(shared), node_id);
    if (rank.ok() && *rank != static_cast<uint32_t>(shared)) {
      rank = absl::InternalError(absl::StrCat(what, ": local rank ", group.local_rank(),
                                              " was registered as rank ", *rank,
                                              ", local rank 0 as ", shared));
    }
  }
  RETURN_IF_ERROR(ShareStatus(group, rank.status(), what));
  // A local rank beyond the shards asks none of them where the job starts,
  // and shards of different local ranks are compared nowhere else.
  uint64_t resumed = client.resumed_from_step();
  RETURN_IF_ERROR(BroadcastStep(group, &resumed));
  RETURN_IF_ERROR(ShareStatus(group, client.AgreeResumedFromStep(resumed), what));
  return *rank;
}

absl::Status PushNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<const float> model) {
  std::vector<float> copy(model.size());
  if (group.local_rank() == 0) std::copy(model.begin(), model.end(), copy.begin());
  RETURN_IF_ERROR(group.Broadcast(0, absl::MakeSpan(copy)));
  return ShareStatus(group, client.PushModel(copy), "PushNodeModel");
}

absl::Status PullNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<float> model, bool wait_for_init) {
  RETURN_IF_ERROR(ShareStatus(group, client.PullModel(model, wait_for_init),
                              "PullNodeModel"));
  const BlockLayout& layout = client.layout();
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    if (layout.ShardSize(s) == 0) continue;
    RETURN_IF_ERROR(group.Broadcast(
        s % group.size(), model.subspan(layout.ShardFirstFloat(s), layout.ShardSize(s))));
  }
  return absl::OkStatus();
}

}  // namespace cserps
