// A node's local ranks as one member of the job (docs/protocol.md
// "Intra-node groups"): local rank j of a group of L talks only to the
// shards s with s mod L == j, and the node's calls are collectives of its
// group. Its averages are staged_average.h's (StartStagedAverage with the
// group).
//
// Set-up on every local rank of a node, in this order:
//   PsClientOptions options;
//   options.shard_stride = group->size();
//   options.shard_offset = group->local_rank();
//   client = PsClient::Connect(config, d, options);
//   rank = RegisterNode(*group, *client, requested_rank, node_id);
//
// Every function here runs collectives on the group, so every local rank
// calls the same ones in the same order. A local rank waits in a collective
// while its peers wait for the servers, so the group's collective timeout
// must exceed the longest server call (cluster.round_timeout_s +
// PsClientOptions::rpc_slack, and setup_timeout for RegisterNode,
// PushNodeModel and PullNodeModel).
#ifndef CSERPS_WORKER_PS_NODE_CLIENT_H_
#define CSERPS_WORKER_PS_NODE_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "worker/group/local_group.h"
#include "worker/ps/ps_client.h"

namespace cserps {

// The shards local rank `local_rank` of a group of `local_size` talks to:
// s < num_shards with s % local_size == local_rank, ascending (none when
// local_rank >= num_shards).
std::vector<uint32_t> GroupShards(uint32_t num_shards, uint32_t local_size,
                                  uint32_t local_rank);

// How long a local rank may wait in a collective: its peers may be waiting
// for the servers meanwhile, for up to a round (plus the client's slack) or
// a set-up call (RegisterNode, PushNodeModel, PullNodeModel).
absl::Duration NodeGroupTimeout(const v1::JobConfig& config, const PsClientOptions& client);

// Registers the node as one member: local rank 0 registers with its shards
// (shard 0 assigns the rank when requested_rank < 0), the rank is shared in
// the group, and the other local ranks register with theirs under it, all
// with `node_id` as the worker id. The node starts where shard 0 says
// (PsClient::resumed_from_step of every local rank's client), which every
// local rank's shards must agree with. Every local rank calls it with the
// same arguments and a client as in the set-up above; every one returns the
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

#endif  // CSERPS_WORKER_PS_NODE_CLIENT_H_
