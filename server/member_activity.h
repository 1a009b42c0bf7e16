// When one shard last heard from each rank of the job, for the members-alive
// gauge (docs/metrics.md, cserps_server_members_alive).
//
// A rank is alive at `now` while a call of its to this shard is in progress
// (parked in a round or behind the staleness gate: it is waiting on the
// others, not silent), or when its last call arrived or was answered less
// than `silence_timeout` (cluster.round_timeout_s) before `now`. This is the
// liveness rule of asynchronous SGD (server/async_staleness_gate.h) applied
// to every call that names a registered rank: Register, PushPull, PushModel,
// SparsePushPull and AsyncPushPull. PullModel and GetStatus name no rank and
// do not count.
//
// It also bounds the calls a rank may keep waiting on the shard at once
// (docs/security.md): a client that sends the same push again and again
// without waiting would otherwise park a reply for each.
//
// Thread-safe. The services of a shard report with one clock (PsServer
// hands them the same one), so times from different services compare.
#ifndef CSERPS_SERVER_MEMBER_ACTIVITY_H_
#define CSERPS_SERVER_MEMBER_ACTIVITY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cserps {

class MemberActivity {
 public:
  MemberActivity(uint32_t world_size, absl::Duration silence_timeout,
                 uint32_t max_calls_per_rank);

  // A call from `rank` was answered at once at `now`. Ranks out of range
  // are ignored (the services refuse them before reporting anything).
  void Heard(uint32_t rank, absl::Time now);
  // A call from `rank` that arrived at `now` is answered later; exactly one
  // CallEnded follows, when it is answered (successfully or not). With
  // `max_calls_per_rank` of its calls already waiting, RESOURCE_EXHAUSTED
  // instead: the call was heard but is not counted, and no CallEnded may
  // follow.
  absl::Status CallStarted(uint32_t rank, absl::Time now);
  void CallEnded(uint32_t rank, absl::Time now);

  // Ranks alive at `now` (rule above).
  uint32_t Alive(absl::Time now) const;
  absl::Duration silence_timeout() const { return silence_timeout_; }

 private:
  struct Rank {
    absl::Time last_heard = absl::InfinitePast();
    uint32_t calls_in_progress = 0;
  };

  const absl::Duration silence_timeout_;
  const uint32_t max_calls_per_rank_;
  mutable absl::Mutex mu_;
  std::vector<Rank> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_SERVER_MEMBER_ACTIVITY_H_
