// How a trainer (trainer.h) is placed in its job: how it reaches the
// servers, which rank and data partition it is, its batch size and steps.
//
// A trainer is one process of the job (a thread, for local ranks run as
// threads): flat, it is a member of its own; in a node of
// cluster.local_size = L > 1 processes it is one local rank, and the node is
// the member (worker/ps/node_client.h). Either way it trains on its own
// data partition with its own batch size and writes its own summary.
#ifndef CSERPS_WORKER_TRAINER_TRAINER_PLAN_H_
#define CSERPS_WORKER_TRAINER_TRAINER_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "worker/data/batcher.h"
#include "worker/group/local_group.h"
#include "worker/ps/ps_client.h"

namespace cserps {

// How a trainer reaches the servers. Both pointers outlive the trainer.
struct TrainerLink {
  // This process's client, registered: client->rank() is the member's rank
  // (the node's, in a node). In a node it covers only this local rank's
  // shards (PsClientOptions::shard_stride = L, shard_offset = local rank)
  // and was registered with RegisterNode. The summary and the metrics report
  // its traffic: this process's share of the node's.
  PsClient* client = nullptr;
  // This process's member of its node's group, whose size must be
  // cluster.local_size; null for a flat worker (cluster.local_size 1). With
  // a group every local rank of the node must drive its trainer through the
  // same calls in the same order (they are collectives).
  LocalGroup* group = nullptr;
};

// What a trainer derives from the job, its link and the training set's size.
struct TrainerPlan {
  uint32_t rank = 0;        // the member's (the node's, in a node)
  uint32_t local_rank = 0;  // 0 for a flat worker
  uint32_t partition = 0;   // DataPartition(rank, local_rank, local_size)
  uint32_t batch_size = 0;  // the partition's, also its weight in averages
  size_t steps_per_epoch = 0;
  Range range;  // the partition's examples
  // Floats of the shards this process talks to (all d when flat): what its
  // achieved compression is measured against.
  uint64_t shard_floats = 0;
  std::string log_prefix;  // "local rank j: " in a node
};
// The plan without the data (steps_per_epoch and range left 0), for a
// trainer whose caller brings the data (external_trainer.h).
// FAILED_PRECONDITION naming cluster.local_size when the link's group (or
// its absence) does not match it; INVALID_ARGUMENT for a rank not below
// num_workers or a partition the config has no batch size for.
absl::StatusOr<TrainerPlan> PlanPlace(const v1::JobConfig& config, const TrainerLink& link);

// PlanPlace's, and INVALID_ARGUMENT for too few examples for one step.
absl::StatusOr<TrainerPlan> PlanTrainer(const v1::JobConfig& config, const TrainerLink& link,
                                        size_t train_size);

// The data partition of local rank `local_rank` of the node (or flat
// worker, local_size 1) of rank `rank`: rank * local_size + local_rank. The
// training set is split into num_workers * local_size partitions, one per
// process, in proportion to RankBatchSizes (one entry per process), and
// data.rank_slowdown is indexed the same way.
uint32_t DataPartition(uint32_t rank, uint32_t local_rank, uint32_t local_size);

// The whole model to or from the servers through `link`: the client's
// calls, or in a node the group's (PushNodeModel, PullNodeModel; every
// local rank calls them).
absl::Status PushModel(const TrainerLink& link, absl::Span<const float> model);
absl::Status PullModel(const TrainerLink& link, absl::Span<float> model, bool wait_for_init);

// `mine` for a flat worker; in a node every local rank's verdict
// (ShareStatus, a collective of the node), so that the peers of a local rank
// that failed on its own fail with it at once instead of waiting for it in
// their next collective until the group's timeout.
absl::Status SharedStatus(const TrainerLink& link, const absl::Status& mine,
                          absl::string_view what);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_TRAINER_PLAN_H_
