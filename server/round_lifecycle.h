// The life of the synchronous rounds of one server shard, whatever they
// collect: the core of the dense RoundTable (round_table.h) and of the
// SparseRoundTable (sparse_round_table.h), which supply the `Aggregate`.
//
// A round is identified by its Key. Its first push opens it, if the key's
// step is inside the window (below). Every member (rank < world_size) then
// adds its contribution once: a retry of the same rank joins the waiters but
// is never counted twice. When the last member has pushed, the round is
// completing: `finish` turns its aggregate into the round's Result without
// the lock (the shard applies the result to its model there), and only then
// is every waiting caller answered with that one Result. A retry arriving
// while `finish` runs waits for it. The round is then retained to answer
// later retries, as one of the newest `retained_rounds` steps of its stream,
// and afterwards retired. docs/protocol.md 7.6 to 7.9.
//
// The window: a push that would open a round is refused with OUT_OF_RANGE
// when its step is a retired step of its stream or older ("too far
// behind"), or more than max_step_lag after the newest completed step of any
// stream ("too far ahead"). A round open `timeout` after its first push
// fails (ExpireOverdue), and FailAll fails every open round and every later
// push (shutdown).
//
// Elastic (RoundLimits::elastic): the members start as every rank. A round
// overdue at ExpireOverdue completes instead with the contributions of the
// members that pushed, and the members that did not are dropped: rounds
// then complete once every remaining member has pushed (those already open
// too), and a dropped rank's pushes are refused with FAILED_PRECONDITION.
// A round that no remaining member pushed to fails as before. Admit takes a
// dropped rank back as a member from a step on none of whose rounds it
// would join has begun: it is expected in that step's rounds after its full
// average (Aggregate::kFullAverageStream), which it does not join, and in
// every later step's. A round is sized for the members it begins with.
//
// What Aggregate provides (see WeightedSum and SparsePushes):
//   Key            the round's identity; ordered by operator<
//   Contribution   one member's push, passed by value to Add
//   Shape          what every push of one round must agree on (a length)
//   Result         the answer of a completed round, shared by every caller;
//                  cheap to copy (a shared_ptr to const)
//   Aggregate(const Contribution& first, uint32_t world_size)
//                  an empty aggregate for the round `first` opens
//   void Add(uint32_t rank, Contribution)        once per rank
//   static Shape ShapeOf(const Contribution&)
//   static absl::Status Check(key, rank, const Contribution&)
//                  OK, or INVALID_ARGUMENT for a push refused before it
//                  reaches any round
//   static absl::Status CheckShape(key, rank, Shape got, Shape round's)
//   static uint64_t Step(key);  static int Stream(key)
//   static std::string RoundName(key), PushName(key, rank), StepName(key)
//                  how messages name a round, a push and its step
//   static constexpr absl::string_view kKind     "" or "sparse ", the word
//                  before "rounds" and "step" in the window messages
//   static constexpr int kFullAverageStream      the stream of the full
//                  averages a rank is admitted at (Admit); -1: none
//
// Thread safety: every method may be called from any thread. Callbacks
// (`finish`, the callers' Callbacks) are never called with the lock held; a
// Callback may run inline in the push (the round was already complete, this
// push completed it, or the push was refused) or later on the thread of the
// push that completes the round, or of ExpireOverdue / FailAll.
//
// The members are defined in round_lifecycle_impl.h, which only the files
// instantiating the template include (round_table.cc, sparse_round_table.cc).
#ifndef CSERPS_SERVER_ROUND_LIFECYCLE_H_
#define CSERPS_SERVER_ROUND_LIFECYCLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cserps {

// The bounds of a table's rounds.
struct RoundLimits {
  uint32_t world_size = 1;  // the members: ranks 0 .. world_size - 1
  // A push that would open a round more than this many steps after the
  // newest completed step (over all streams) is refused with OUT_OF_RANGE
  // ("too far ahead").
  uint64_t max_step_lag = 8;
  // Completed steps kept per stream, newest first, to answer retries; older
  // ones are retired, and a push that would open a round at a retired or
  // older step is refused with OUT_OF_RANGE ("too far behind").
  uint32_t retained_rounds = 4;
  // A round still open this long after its first push fails.
  absl::Duration timeout = absl::Seconds(60);
  // The window starts as if a round of this step had completed: a resumed
  // job's first rounds are at its checkpoint's step.
  uint64_t first_step = 0;
  // Elastic membership: a round still open at its timeout completes with
  // the members that pushed, and those missing are dropped (below).
  bool elastic = false;
  // Optional: whether `rank`'s pushes are still admitted, asked again under
  // the table's lock (a shard that rolled back between a push's admission
  // and its arrival here refuses it, or it would join a round of the new
  // timeline). Takes only locks that are never held while calling into
  // the table.
  std::function<absl::Status(uint32_t rank)> admitted = nullptr;
};

// Told once per push, before any reply to it can go out, whether it joined
// a round (or was answered from one) or was refused: a request counted here
// is in the counts before its sender, or any member the round answers, can
// read them.
using CountPush = absl::FunctionRef<void(bool joined)>;
inline void CountNoPush(bool /*joined*/) {}

template <typename Aggregate>
class RoundLifecycle {
 public:
  using Key = typename Aggregate::Key;
  using Contribution = typename Aggregate::Contribution;
  using Shape = typename Aggregate::Shape;
  using Result = typename Aggregate::Result;
  using Callback = std::function<void(absl::StatusOr<Result>)>;

  // Called once per completed round, without the lock, before any waiter is
  // answered; `latency` is from the round's first push to the push that
  // completed it (the `now`s given to Contribute).
  using Finish =
      std::function<Result(const Key&, Aggregate aggregate, absl::Duration latency)>;

  RoundLifecycle(const RoundLifecycle&) = delete;
  RoundLifecycle& operator=(const RoundLifecycle&) = delete;

  // Fails every round whose first push is `timeout` or more before `now`
  // with DEADLINE_EXCEEDED "<round> timed out after <timeout>s: missing
  // ranks <r, ...> of world_size <n>" (elastic: completes it and drops the
  // missing members, when a member pushed); returns how many it failed or
  // completed so. A failed round is forgotten: later pushes for its key
  // start a new round.
  int ExpireOverdue(absl::Time now);
  // When the oldest open round becomes overdue; InfiniteFuture when none.
  absl::Time NextDeadline() const;
  // Fails every open round with UNAVAILABLE "<round> failed: <reason>" and
  // refuses later pushes with "<push> refused: <reason>".
  void FailAll(const std::string& reason);
  // Starts the rounds over as if the table had been created with
  // first_step `first_step` (a roll back to a checkpoint): fails every open
  // round with ABORTED "<round> aborted: <reason>" (not counted as failed),
  // waits for the rounds completing to be answered, then runs `reload` (the
  // shard's model goes back) while pushes are refused with ABORTED, and
  // forgets every retained round. Returns `reload`'s status; when it
  // fails, later pushes are refused as after FailAll. Membership stays.
  absl::Status Restart(uint64_t first_step, const std::string& reason,
                       const std::function<absl::Status()>& reload);

  size_t open_rounds() const;
  // Waits (no polling) until at least `count` calls, retries included, wait
  // in open rounds; false on timeout.
  bool WaitForWaitingCalls(size_t count, absl::Duration timeout) const;
  uint64_t rounds_completed() const;
  uint64_t rounds_failed() const;
  // The same, of the rounds of one stream (Aggregate::Stream).
  uint64_t rounds_completed(int stream) const;
  uint64_t rounds_failed(int stream) const;
  // Newest step of any completed round; 0 before the first.
  uint64_t newest_step() const;
  // Elastic: takes dropped rank `rank` back as a member from step `step`
  // on: the rounds of that step after its full average, and every later
  // step's, wait for it. FAILED_PRECONDITION when the table is not elastic,
  // `rank` is a member (not dropped, or admitted already at another step;
  // the same step again is OK), or a round it would join has begun, or a
  // round of `step` or later has completed (too late: a later step can
  // still be taken); INVALID_ARGUMENT for a rank out of range.
  absl::Status Admit(uint32_t rank, uint64_t step);

  // The members rounds wait for, the ranks dropped, in drop order, and the
  // ranks admitted back, in admission order.
  uint32_t members() const;
  std::vector<uint32_t> dropped_ranks() const;
  std::vector<uint32_t> admitted_ranks() const;
  // By rank: how many times it has been dropped.
  std::vector<uint32_t> times_dropped() const;
  // Called (without the lock) with the ranks an overdue round dropped and
  // that round's name; set before the first push.
  void SetDropObserver(std::function<void(const std::vector<uint32_t>&, const std::string&)> f) {
    on_dropped_ = std::move(f);
  }

 protected:
  // `finish` is required.
  RoundLifecycle(RoundLimits limits, Finish finish);
  // Fails the rounds still open, so that no caller waits forever.
  ~RoundLifecycle();

  // Adds `rank`'s `contribution` to round `key` at time `now`. `done` is
  // called exactly once with the round's Result, or with INVALID_ARGUMENT
  // (rank >= world_size, Aggregate::Check, Aggregate::CheckShape against the
  // round's first push, also for retries), OUT_OF_RANGE (the window),
  // DEADLINE_EXCEEDED (ExpireOverdue) or UNAVAILABLE (FailAll). `count` is
  // called first, once: see CountPush.
  void Contribute(const Key& key, uint32_t rank, Contribution contribution,
                  absl::Time now, Callback done, CountPush count);

 private:
  // A round still collecting pushes.
  struct Round {
    // `members` of the `world_size` ranks are expected to push.
    Round(const Contribution& first, uint32_t members, uint32_t world_size, absl::Time now)
        : aggregate(first, members),
          shape(Aggregate::ShapeOf(first)),
          pushed(world_size, false),
          first_push(now) {}
    Aggregate aggregate;
    Shape shape;
    std::vector<bool> pushed;  // by rank, so that a retry is not counted twice
    std::vector<Callback> waiters;
    absl::Time first_push;
  };
  // A round whose last push has arrived but whose `finish` has not returned:
  // retries wait here rather than being answered before the shard applied
  // the result, or opening a new round.
  struct CompletingRound {
    Shape shape;
    std::vector<Callback> waiters;
  };
  struct RetainedRound {
    Shape shape;
    Result result;
  };
  // The completed rounds of one stream kept to answer retries.
  struct StreamHistory {
    std::map<uint64_t, std::map<Key, RetainedRound>> by_step;
    bool retired_any = false;
    uint64_t newest_retired = 0;  // meaningful only when retired_any
  };
  using FailedRounds = std::vector<std::pair<absl::Status, std::vector<Callback>>>;
  using RoundNode = typename std::map<Key, Round>::node_type;

  const RetainedRound* FindRetainedLocked(const Key& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when a new round may be opened for `key`.
  absl::Status CheckWindowLocked(const Key& key, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `result` for retries, retires the stream's steps beyond
  // retained_rounds and counts the round.
  void RetainLocked(const Key& key, Shape shape, const Result& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountFailureLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers every waiter of `failed` with its round's status; call without
  // the lock.
  static void Answer(FailedRounds& failed);
  // Whether round `key` waits for `rank`'s push.
  bool ExpectsLocked(const Key& key, uint32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a rank admitted back from step `since` joins round `key`.
  static bool JoinsFrom(const Key& key, uint64_t since);
  uint32_t ExpectedLocked(const Key& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every rank round `key` waits for has pushed to `round`.
  bool CompleteLocked(const Key& key, const Round& round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `it` out of open_ as completing.
  RoundNode ExtractCompletingLocked(typename std::map<Key, Round>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes a round taken out of open_ and answers its waiters; call
  // without the lock.
  void FinishRound(RoundNode completed, absl::Time now);

  const RoundLimits limits_;
  const Finish finish_;
  mutable absl::Mutex mu_;
  std::map<Key, Round> open_ ABSL_GUARDED_BY(mu_);
  std::map<Key, CompletingRound> completing_ ABSL_GUARDED_BY(mu_);
  std::map<int, StreamHistory> streams_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool restarting_ ABSL_GUARDED_BY(mu_) = false;  // in Restart: pushes refused
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, uint64_t> completed_by_stream_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> failed_by_stream_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_step_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> member_ ABSL_GUARDED_BY(mu_);  // by rank
  // By rank: the step a member was admitted back at; nullopt: a member
  // since the start.
  std::vector<std::optional<uint64_t>> admitted_at_ ABSL_GUARDED_BY(mu_);
  uint32_t members_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> dropped_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> admitted_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::vector<uint32_t>&, const std::string&)> on_dropped_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_LIFECYCLE_H_
