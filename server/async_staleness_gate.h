// The bounded-staleness rule of asynchronous SGD on one shard
// (docs/protocol.md, "Asynchronous SGD"): a push from rank r at step t may be
// applied once t <= m + s, where m is the newest step received from the
// slowest live rank (-1 for a live rank not heard from yet) and
// s = algorithm.staleness; s = 0 admits every push at once.
//
// Liveness: a rank is live until it has been silent (no push received) for
// `silence_timeout` on the expiry path (ExpireSilentRanks); the silence of a
// rank never heard from counts from the shard's first push of any rank. A
// rank with a parked push is never silent: it is waiting on the others. A
// dead rank that pushes again is live again and counts from the slowest
// live rank's step (its steps shifted up to it, never down), so it holds
// the others back one step at a time, as any live rank does.
//
// Thread safety: every method may be called from any thread. Release
// callbacks run exactly once each, without the gate's lock, on the thread of
// the Arrive, ExpireSilentRanks or FailAll call that released them.
#ifndef CSERPS_SERVER_ASYNC_STALENESS_GATE_H_
#define CSERPS_SERVER_ASYNC_STALENESS_GATE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cserps {

class StalenessGate {
 public:
  // OK: apply the push now. Otherwise the reason it will never be applied
  // (FailAll).
  using Release = std::function<void(absl::Status)>;

  struct Options {
    uint32_t world_size = 0;
    // s; 0 = no bound.
    uint64_t staleness = 0;
    absl::Duration silence_timeout = absl::Seconds(60);
  };

  explicit StalenessGate(Options options);

  // Records that `rank` (< world_size, checked by the caller) has reached
  // `step` (below 2^62, checked by the caller) at `now`, then calls `release(OK)` at once when the push is
  // admitted, or parks it until the slowest live rank advances or is
  // declared dead. Pushes other ranks parked that this arrival admits are
  // released too.
  void Arrive(uint32_t rank, uint64_t step, absl::Time now, Release release);

  // Declares dead every live rank without a parked push that has been silent
  // for at least silence_timeout at `now`, and releases the pushes this
  // admits. Returns how many ranks were declared dead.
  int ExpireSilentRanks(absl::Time now);

  // Fails every parked push and every later arrival with `reason`.
  void FailAll(const absl::Status& reason);

  size_t parked() const;
  // Waits (without polling) until at least `count` pushes are parked;
  // false when `timeout` passes first. For tests and monitoring.
  bool WaitForParked(size_t count, absl::Duration timeout) const;
  // Ranks currently considered dead, ascending.
  std::vector<uint32_t> DeadRanks() const;

 private:
  struct RankState {
    int64_t newest_step = -1;  // shifted; -1: nothing received yet
    // Added to the rank's steps since it came back from the dead behind
    // the others.
    int64_t shift = 0;
    absl::Time last_heard = absl::InfinitePast();
    bool dead = false;
  };
  struct Parked {
    uint32_t rank;
    int64_t step;  // shifted
    Release release;
  };

  // m: the smallest newest step over the live ranks; INT64_MAX when none.
  int64_t SlowestLiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AdmitsLocked(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the parked pushes that are now admitted into `out`.
  void CollectAdmittedLocked(absl::Time now, std::vector<Release>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  std::vector<Parked> parked_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ASYNC_STALENESS_GATE_H_
