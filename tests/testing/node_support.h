// Nodes of several local ranks inside one test process: the processes are
// threads, each node's group a ThreadGroup, and each local rank's client
// reaches only its own shards.
#ifndef CSERPS_TESTS_TESTING_NODE_SUPPORT_H_
#define CSERPS_TESTS_TESTING_NODE_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/group/local_group.h"
#include "worker/ps/ps_client.h"

namespace cserps::testing {

// A PsClient for local rank `local_rank` of a group of `local_size`: the
// addresses of the shards it must not talk to point nowhere (a port nothing
// listens on), so a call to one could not succeed.
absl::StatusOr<std::unique_ptr<PsClient>> ConnectLocalRank(v1::JobConfig config,
                                                           uint64_t d,
                                                           uint32_t local_size,
                                                           uint32_t local_rank);

// Runs fn(node, local_rank, group member) on one thread per process of
// `nodes` nodes of `local_size` (one ThreadGroup each, 60 s collective
// timeout) and returns each one's status, by member index
// node * local_size + local_rank.
std::vector<absl::Status> OnEveryProcess(
    uint32_t nodes, uint32_t local_size,
    const std::function<absl::Status(uint32_t, uint32_t, LocalGroup&)>& fn);

}  // namespace cserps::testing

#endif  // CSERPS_TESTS_TESTING_NODE_SUPPORT_H_
