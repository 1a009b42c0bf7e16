// Averaging in two levels (docs/protocol.md "Intra-node groups"): the
// processes of a node average inside their LocalGroup first, and the node
// then takes part in the servers' rounds as one member whose weight is the
// sum of its processes' weights. Local rank j of a group of L talks only to
// the shards s with s mod L == j and shares their results with the others.
//
// Set-up on every local rank of a node, in this order:
//   PsClientOptions options;
//   options.shard_stride = group->size();
//   options.shard_offset = group->local_rank();
//   client = PsClient::Connect(config, d, options);
//   rank = RegisterNode(*group, *client, requested_rank, node_id);
//   HierarchicalCommunicator comm(config, d, group, client.get());
// and the algorithm is given `comm` as its Communicator.
//
// Every function here runs collectives on the group, so every local rank
// calls the same ones in the same order (as they do when they all run the
// same algorithm). A local rank waits in a collective while its peers wait
// for the servers, so the group's collective timeout must exceed the longest
// server call (cluster.round_timeout_s + PsClientOptions::rpc_slack, and
// setup_timeout for RegisterNode, PushNodeModel and PullNodeModel).
#ifndef CSERPS_WORKER_HIERARCHICAL_COMMUNICATOR_H_
#define CSERPS_WORKER_HIERARCHICAL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "cserps/v1/config.pb.h"
#include "worker/communicator.h"
#include "worker/group/local_group.h"
#include "worker/ps_client.h"

namespace cserps {

// The shards local rank `local_rank` of a group of `local_size` talks to:
// s < num_shards with s % local_size == local_rank, ascending (none when
// local_rank >= num_shards).
std::vector<uint32_t> GroupShards(uint32_t num_shards, uint32_t local_size,
                                  uint32_t local_rank);

class HierarchicalCommunicator final : public Communicator {
 public:
  // `config` has defaults applied and is valid; `num_params` is the model's
  // d. `group` is this process's member of its node's group; `servers`
  // reaches the servers as the node's member and covers exactly this local
  // rank's GroupShards (a PsClient as in the set-up above; may be null
  // where that is empty). Both outlive the communicator.
  HierarchicalCommunicator(const v1::JobConfig& config, uint64_t num_params,
                           LocalGroup* group, Communicator* servers);

  // As Communicator::StartAverage, with every local rank passing its own
  // `values` and `weight` and the same stream, step, ratio and lr. Returns
  // after the group's sum of weight * values over the selected blocks (an
  // AllReduceSum); local rank j has then sent its shards' part of that sum
  // divided by the summed weight W, with weight W, to the servers. Wait()
  // shares every shard's mean from its local rank, so every local rank ends
  // with the same bits: the mean over every process of every node, as if
  // each were a member with its own weight (up to the rounding of the local
  // float32 sum). Wait() is a collective: every local rank calls it, in the
  // order of their StartAverage calls, from the thread that uses the group;
  // destroying the pending average unawaited waits for it. A pending average
  // must not outlive the communicator.
  //
  // Errors: INVALID_ARGUMENT for a `values` or `mean` that is not d floats;
  // a group failure (a peer that never joins); and the servers' error on the
  // local rank whose shards failed, while its peers get an error of the
  // same code naming that local rank and its shards.
  std::unique_ptr<PendingAverage> StartAverage(v1::Stream stream, uint64_t step,
                                               uint32_t ratio,
                                               absl::Span<const float> values,
                                               float weight, float lr,
                                               absl::Span<float> mean) override;

  // ExchangeSparse: not supported yet (the base class's UNIMPLEMENTED).

 private:
  class Pending;

  // A model-sized buffer for the servers' part of one average; reused,
  // since only the selected floats of this rank's shards are ever read.
  std::vector<float> TakeScratch();
  void ReturnScratch(std::vector<float> scratch);

  const v1::JobConfig config_;
  const BlockLayout layout_;
  LocalGroup* const group_;
  Communicator* const servers_;
  absl::Mutex mu_;
  std::vector<std::vector<float>> spare_scratch_ ABSL_GUARDED_BY(mu_);
};

// Registers the node as one member: local rank 0 registers with its shards
// (shard 0 assigns the rank when requested_rank < 0), the rank is shared in
// the group, and the other local ranks register with theirs under it, all
// with `node_id` as the worker id. Every local rank calls it with the same
// arguments and a client as in the set-up above; every one returns the
// node's rank, or an error if any local rank's registration failed.
absl::StatusOr<uint32_t> RegisterNode(LocalGroup& group, PsClient& client,
                                      int requested_rank, const std::string& node_id);

// Writes local rank 0's `model` (d floats) to the servers, each local rank
// writing its shards (rank 0 of the job initialising it). Every local rank
// calls it with d floats; only local rank 0's values are read.
absl::Status PushNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<const float> model);

// Reads the whole model (d floats) into `model` on every local rank: each
// reads its shards and shares them. With `wait_for_init`, waits until the
// model was pushed. An error on any local rank fails it on all.
absl::Status PullNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<float> model, bool wait_for_init);

}  // namespace cserps

#endif  // CSERPS_WORKER_HIERARCHICAL_COMMUNICATOR_H_
