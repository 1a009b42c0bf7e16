// The open sparse top-k rounds of one server shard: one round per step.
//
// Every member pushes its sparse vector for the step once; when the last
// member has pushed, Options::complete runs once (it aggregates, applies the
// result to the shard's model and encodes the reply), and then every waiting
// caller gets the same reply. Retries are never counted twice, completed
// rounds of the newest `retained_rounds` steps answer retries, a round open
// longer than `timeout` fails naming the missing ranks. The same rules as
// the dense RoundTable (docs/protocol.md 7.6 to 7.9), keyed by step alone.
//
// Thread safety: every method may be called from any thread. Callbacks are
// never called with the table's lock held; one may run inline in Push (the
// round was already complete, this push completed it, or it was refused) or
// later on the thread of the push that completes the round, or of
// ExpireOverdue / FailAll.
#ifndef CSERPS_SERVER_SPARSE_ROUND_TABLE_H_
#define CSERPS_SERVER_SPARSE_ROUND_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/sparse_aggregate.h"

namespace cserps {

using SparseRoundReply = std::shared_ptr<const SparseReply>;
using SparseRoundCallback = std::function<void(absl::StatusOr<SparseRoundReply>)>;

class SparseRoundTable {
 public:
  struct Options {
    uint32_t world_size = 1;
    // A push that would open a round more than this many steps after the
    // newest completed one is refused with OUT_OF_RANGE.
    uint64_t max_step_lag = 8;
    // Completed steps kept to answer retries; a push for an older step that
    // would open a round is refused with OUT_OF_RANGE ("too far behind").
    uint32_t retained_rounds = 4;
    absl::Duration timeout = absl::Seconds(60);
    // Called once per completed round with the members' pushes by rank,
    // without the lock, before any waiter is answered. Required.
    std::function<SparseReply(uint64_t step, std::vector<SparseEntries> pushes)>
        complete;
    // Optional: called once per completed round, after `complete` and before
    // any waiter is answered, with the time from the round's first push to
    // the push that completed it (the `now`s given to Push).
    std::function<void(absl::Duration)> on_latency;
  };

  explicit SparseRoundTable(Options options);
  SparseRoundTable(const SparseRoundTable&) = delete;
  SparseRoundTable& operator=(const SparseRoundTable&) = delete;
  // Fails the rounds still open.
  ~SparseRoundTable();

  // Adds `rank`'s `entries` to the round of `step` at time `now`. `done` is
  // called exactly once with the reply, or with INVALID_ARGUMENT (rank out
  // of range), OUT_OF_RANGE (step window), DEADLINE_EXCEEDED (the round
  // timed out; names the missing ranks) or UNAVAILABLE (FailAll). A retry
  // (same rank and step) is not counted again: its entries are ignored and
  // it gets the round's reply.
  void Push(uint64_t step, uint32_t rank, SparseEntries entries, absl::Time now,
            SparseRoundCallback done);

  // Fails every round open for `timeout` or longer at `now`; returns how
  // many. A failed round is forgotten.
  int ExpireOverdue(absl::Time now);
  // When the oldest open round becomes overdue; InfiniteFuture when none.
  absl::Time NextDeadline() const;
  // Fails every open round and later pushes with UNAVAILABLE `reason`.
  void FailAll(const std::string& reason);

  size_t open_rounds() const;
  uint64_t rounds_completed() const;
  uint64_t rounds_failed() const;
  // Newest step of any completed round; 0 before the first.
  uint64_t newest_step() const;

 private:
  struct Round {
    std::vector<SparseEntries> pushes;  // by rank
    std::vector<bool> pushed;
    uint32_t ranks_pushed = 0;
    std::vector<SparseRoundCallback> waiters;
    absl::Time first_push;
  };

  absl::Status CheckWindowLocked(uint64_t step, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Round> open_ ABSL_GUARDED_BY(mu_);
  // Rounds whose `complete` is running: retries wait here.
  std::map<uint64_t, std::vector<SparseRoundCallback>> completing_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, SparseRoundReply> retained_ ABSL_GUARDED_BY(mu_);
  bool retired_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t newest_retired_ ABSL_GUARDED_BY(mu_) = 0;
  bool completed_any_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t newest_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SPARSE_ROUND_TABLE_H_
