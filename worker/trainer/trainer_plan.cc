#include "worker/trainer/trainer_plan.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/data/partition.h"
#include "worker/ps/node_client.h"

namespace cserps {

uint32_t DataPartition(uint32_t rank, uint32_t local_rank, uint32_t local_size) {
  return rank * local_size + local_rank;
}

absl::StatusOr<TrainerPlan> PlanPlace(const v1::JobConfig& config, const TrainerLink& link) {
  const uint32_t local_size = config.cluster().local_size();
  if (link.group == nullptr && local_size != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", local_size,
        " but this worker has no local group: every node runs its ", local_size,
        " local ranks together (cserps-worker runs them as threads with "
        "--backend=cpu, or one process per GPU with --backend=cuda and "
        "--local_rank)"));
  }
  if (link.group != nullptr && link.group->size() != local_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", local_size, " but the local group has ",
        link.group->size(), " members"));
  }
  TrainerPlan plan;
  plan.rank = link.client->rank();
  plan.local_rank = link.group != nullptr ? link.group->local_rank() : 0;
  if (plan.rank >= config.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", plan.rank, " is not below cluster.num_workers (",
        config.cluster().num_workers(), ")"));
  }
  plan.partition = DataPartition(plan.rank, plan.local_rank, local_size);
  const std::vector<uint32_t> batch_sizes = RankBatchSizes(config);
  if (plan.partition >= batch_sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", plan.rank, " local rank ", plan.local_rank, " (data partition ",
        plan.partition, ") has no batch size: the job has ", batch_sizes.size(),
        " worker processes"));
  }
  plan.batch_size = batch_sizes[plan.partition];
  const BlockLayout& layout = link.client->layout();
  for (uint32_t s : GroupShards(layout.num_shards(), local_size, plan.local_rank)) {
    plan.shard_floats += layout.ShardSize(s);
  }
  if (link.group != nullptr) plan.log_prefix = absl::StrCat("local rank ", plan.local_rank, ": ");
  return plan;
}

absl::StatusOr<TrainerPlan> PlanTrainer(const v1::JobConfig& config, const TrainerLink& link,
                                        size_t train_size) {
  ASSIGN_OR_RETURN(TrainerPlan plan, PlanPlace(config, link));
  const std::vector<uint32_t> batch_sizes = RankBatchSizes(config);
  plan.steps_per_epoch = StepsPerEpoch(train_size, batch_sizes);
  if (plan.steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: ", train_size, " training examples are too few for ",
        batch_sizes.size(), " worker processes with batch sizes of up to ",
        *std::max_element(batch_sizes.begin(), batch_sizes.end()),
        ": not one step per epoch"));
  }
  plan.range = RankRange(train_size, batch_sizes, plan.partition);
  return plan;
}

absl::Status PushModel(const TrainerLink& link, absl::Span<const float> model) {
  if (link.group == nullptr) return link.client->PushModel(model);
  return PushNodeModel(*link.group, *link.client, model);
}

absl::Status PullModel(const TrainerLink& link, absl::Span<float> model, bool wait_for_init) {
  if (link.group == nullptr) return link.client->PullModel(model, wait_for_init);
  return PullNodeModel(*link.group, *link.client, model, wait_for_init);
}

absl::Status SharedStatus(const TrainerLink& link, const absl::Status& mine,
                          absl::string_view what) {
  if (link.group == nullptr) return mine;
  return ShareStatus(*link.group, mine, what);
}

}  // namespace cserps
