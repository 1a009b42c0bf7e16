// How a worker follows a server shard that restarted from a checkpoint
// without restarting itself (docs/reliability.md): it finds the shard (an
// incarnation other than the one it registered with, or a shard that
// already rolled back for one), has every shard go back to that checkpoint
// in place (RollBack, docs/protocol.md 7.12) and registers again; the
// trainer then reloads its own file of the checkpoint.
#ifndef CSERPS_WORKER_TRAINER_ROLL_BACK_H_
#define CSERPS_WORKER_TRAINER_ROLL_BACK_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/ps/ps_client.h"

namespace cserps {

struct RestartedShard {
  uint32_t shard = 0;          // the shard found
  bool restarted = false;      // it restarted; else it rolled back for another
  uint64_t incarnation = 0;    // of the restarted process
  uint64_t step = 0;           // the checkpoint it resumed from
};

// Whether a shard of `client`'s restarted since it registered, or rolled
// back for a restart other than `followed` (the incarnation this client
// last rolled back for). Shards that do not answer are asked again, with
// backoff, for at most `patience`. nullopt: none did (so a failure stands
// as it is). FAILED_PRECONDITION when the shard restarted without a
// checkpoint.
absl::StatusOr<std::optional<RestartedShard>> FindRestartedShard(PsClient& client,
                                                                 uint64_t followed,
                                                                 absl::Duration patience);

// Every shard goes back to the checkpoint `restarted` resumed from (their
// open rounds are aborted). The client then has to register again
// (PsClient::Reregister: the restarted shard lost its registrations).
absl::Status RollBackShards(PsClient& client, const RestartedShard& restarted);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_ROLL_BACK_H_
