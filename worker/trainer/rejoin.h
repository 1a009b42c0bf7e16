// How a worker takes a dropped rank back into a running elastic job
// (cluster.admit_every_steps, docs/reliability.md): it picks the job's next
// admission step, has every shard admit its rank from that step's full
// average on (Rejoin), and waits until every shard has applied that
// average; the servers' model is then the one every member holds, and the
// step's rounds after the average wait for the newcomer.
#ifndef CSERPS_WORKER_TRAINER_REJOIN_H_
#define CSERPS_WORKER_TRAINER_REJOIN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/ps/ps_client.h"

namespace cserps {

// Whether a shard of `client`'s has completed a round: the job is under
// way, and a worker registering now joins it rather than starts it.
absl::StatusOr<bool> JobUnderWay(PsClient& client);

// Admission for `client`'s rank at the first multiple of
// config.cluster().admit_every_steps at least two steps past the newest
// step any shard completed; a shard that refuses (the rank not dropped yet,
// the step begun) is asked again later, with a later step when needed.
// Returns the step once every shard has applied its full average.
// DEADLINE_EXCEEDED when no shard's newest step moves for the round timeout
// plus `patience`; FAILED_PRECONDITION when the job ends (`total_steps`)
// before an admission step; the servers' other errors as they are.
absl::StatusOr<uint64_t> AwaitAdmission(PsClient& client, const v1::JobConfig& config,
                                        uint64_t total_steps, absl::Duration patience,
                                        const std::string& log_prefix);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_REJOIN_H_
