// Rounds whose means are exact in float, for checking that a path loses no
// contribution and counts none twice (the fault-injection test and
// benchmark): member r's values in round t are small integers, so that
// every weighted mean of them (weights 1, at most 16 members) is exact, and
// every reply of every member is compared with it.
#ifndef CSERPS_TOOLS_CLUSTER_EXACT_ROUNDS_H_
#define CSERPS_TOOLS_CLUSTER_EXACT_ROUNDS_H_

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

struct ExactRoundsOptions {
  uint64_t rounds = 0;
  // The server process whose memory is sampled (0: none), after round
  // `warm_up` and at the end.
  pid_t server_pid = 0;
  uint64_t warm_up = 0;
};

struct ExactRoundsResult {
  std::vector<absl::Status> failed;  // by member: its first failed round
  uint64_t wrong_means = 0;          // replies (floats) that were not the exact mean
  uint64_t retries = 0;              // calls the members' clients sent again
  std::vector<absl::Duration> latencies;  // every member's every round
  absl::Duration wall;
  uint64_t rss_after_warm_up = 0;  // bytes
  uint64_t rss_at_end = 0;
};

// Registers config.cluster.num_workers (at most 16) members with the
// servers of `config` (a FLAT model; defaults applied) and runs `rounds`
// MODEL rounds at ratio 1 on one thread per member. Errors: those of
// connecting and registering.
absl::StatusOr<ExactRoundsResult> RunExactRounds(const v1::JobConfig& config,
                                                 const ExactRoundsOptions& options);

}  // namespace cserps

#endif  // CSERPS_TOOLS_CLUSTER_EXACT_ROUNDS_H_
