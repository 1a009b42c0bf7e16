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
//
// Thread safety: every method may be called from any thread. Callbacks
// (`finish`, the callers' Callbacks) are never called with the lock held; a
// Callback may run inline in the push (the round was already complete, this
// push completed it, or the push was refused) or later on the thread of the
// push that completes the round, or of ExpireOverdue / FailAll.
#ifndef CSERPS_SERVER_ROUND_LIFECYCLE_H_
#define CSERPS_SERVER_ROUND_LIFECYCLE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"

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
};

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
  // ranks <r, ...> of world_size <n>"; returns how many. A failed round is
  // forgotten: later pushes for its key start a new round.
  int ExpireOverdue(absl::Time now);
  // When the oldest open round becomes overdue; InfiniteFuture when none.
  absl::Time NextDeadline() const;
  // Fails every open round with UNAVAILABLE "<round> failed: <reason>" and
  // refuses later pushes with "<push> refused: <reason>".
  void FailAll(const std::string& reason);

  size_t open_rounds() const;
  uint64_t rounds_completed() const;
  uint64_t rounds_failed() const;
  // The same, of the rounds of one stream (Aggregate::Stream).
  uint64_t rounds_completed(int stream) const;
  uint64_t rounds_failed(int stream) const;
  // Newest step of any completed round; 0 before the first.
  uint64_t newest_step() const;

 protected:
  // `finish` is required.
  RoundLifecycle(RoundLimits limits, Finish finish);
  // Fails the rounds still open, so that no caller waits forever.
  ~RoundLifecycle();

  // Adds `rank`'s `contribution` to round `key` at time `now`. `done` is
  // called exactly once with the round's Result, or with INVALID_ARGUMENT
  // (rank >= world_size, Aggregate::Check, Aggregate::CheckShape against the
  // round's first push, also for retries), OUT_OF_RANGE (the window),
  // DEADLINE_EXCEEDED (ExpireOverdue) or UNAVAILABLE (FailAll).
  void Contribute(const Key& key, uint32_t rank, Contribution contribution,
                  absl::Time now, Callback done);

 private:
  // A round still collecting pushes.
  struct Round {
    Round(const Contribution& first, uint32_t world_size, absl::Time now)
        : aggregate(first, world_size),
          shape(Aggregate::ShapeOf(first)),
          pushed(world_size, false),
          first_push(now) {}
    Aggregate aggregate;
    Shape shape;
    std::vector<bool> pushed;  // by rank, so that a retry is not counted twice
    uint32_t ranks_pushed = 0;
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

  const RoundLimits limits_;
  const Finish finish_;
  mutable absl::Mutex mu_;
  std::map<Key, Round> open_ ABSL_GUARDED_BY(mu_);
  std::map<Key, CompletingRound> completing_ ABSL_GUARDED_BY(mu_);
  std::map<int, StreamHistory> streams_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, uint64_t> completed_by_stream_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> failed_by_stream_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_step_ ABSL_GUARDED_BY(mu_) = 0;
};

template <typename Aggregate>
RoundLifecycle<Aggregate>::RoundLifecycle(RoundLimits limits, Finish finish)
    : limits_(limits), finish_(std::move(finish)) {
  CSERPS_CHECK(limits_.world_size >= 1);
  CSERPS_CHECK(finish_ != nullptr);
}

template <typename Aggregate>
RoundLifecycle<Aggregate>::~RoundLifecycle() {
  FailAll(absl::StrCat(Aggregate::kKind, "round table destroyed"));
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::Contribute(const Key& key, uint32_t rank,
                                           Contribution contribution, absl::Time now,
                                           Callback done) {
  CSERPS_CHECK(done != nullptr);
  absl::Status refused =
      rank >= limits_.world_size
          ? absl::InvalidArgumentError(absl::StrCat(
                Aggregate::PushName(key, rank), ": rank ", rank,
                " is out of range for world_size ", limits_.world_size))
          : Aggregate::Check(key, rank, contribution);
  if (!refused.ok()) {
    done(std::move(refused));
    return;
  }
  const Shape shape = Aggregate::ShapeOf(contribution);
  std::optional<Result> retained;
  typename std::map<Key, Round>::node_type completed;  // when this push completes it
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      refused = absl::UnavailableError(
          absl::StrCat(Aggregate::PushName(key, rank), " refused: ", shutdown_reason_));
    } else if (const RetainedRound* r = FindRetainedLocked(key)) {
      refused = Aggregate::CheckShape(key, rank, shape, r->shape);
      if (refused.ok()) retained = r->result;
    } else if (auto c = completing_.find(key); c != completing_.end()) {
      refused = Aggregate::CheckShape(key, rank, shape, c->second.shape);
      if (refused.ok()) {
        c->second.waiters.push_back(std::move(done));
        return;
      }
    } else {
      auto it = open_.find(key);
      if (it == open_.end()) {
        refused = CheckWindowLocked(key, rank);
        if (refused.ok()) {
          it = open_.try_emplace(key, contribution, limits_.world_size, now).first;
        }
      }
      if (refused.ok()) refused = Aggregate::CheckShape(key, rank, shape, it->second.shape);
      if (refused.ok()) {
        Round& round = it->second;
        if (!round.pushed[rank]) {
          round.aggregate.Add(rank, std::move(contribution));
          round.pushed[rank] = true;
          ++round.ranks_pushed;
        }
        round.waiters.push_back(std::move(done));
        if (round.ranks_pushed < limits_.world_size) return;
        completed = open_.extract(it);
        completing_[key].shape = shape;
      }
    }
  }
  if (!refused.ok()) {
    done(std::move(refused));
    return;
  }
  if (retained.has_value()) {
    done(*std::move(retained));
    return;
  }

  // Nothing else touches the round once it left open_.
  Round& round = completed.mapped();
  const Result result =
      finish_(key, std::move(round.aggregate), now - round.first_push);
  std::vector<Callback> waiters = std::move(round.waiters);
  {
    absl::MutexLock lock(&mu_);
    auto node = completing_.extract(key);
    CSERPS_CHECK(!node.empty());
    for (Callback& w : node.mapped().waiters) waiters.push_back(std::move(w));
    RetainLocked(key, round.shape, result);
  }
  for (Callback& w : waiters) w(result);
}

template <typename Aggregate>
auto RoundLifecycle<Aggregate>::FindRetainedLocked(const Key& key) const
    -> const RetainedRound* {
  auto stream = streams_.find(Aggregate::Stream(key));
  if (stream == streams_.end()) return nullptr;
  auto step = stream->second.by_step.find(Aggregate::Step(key));
  if (step == stream->second.by_step.end()) return nullptr;
  auto round = step->second.find(key);
  return round == step->second.end() ? nullptr : &round->second;
}

template <typename Aggregate>
absl::Status RoundLifecycle<Aggregate>::CheckWindowLocked(const Key& key,
                                                          uint32_t rank) const {
  const uint64_t step = Aggregate::Step(key);
  auto stream = streams_.find(Aggregate::Stream(key));
  if (stream != streams_.end() && stream->second.retired_any &&
      step <= stream->second.newest_retired) {
    return absl::OutOfRangeError(absl::StrCat(
        Aggregate::PushName(key, rank), ": ", Aggregate::StepName(key),
        " is too far behind: ", Aggregate::kKind, "rounds up to step ",
        stream->second.newest_retired, " are retired"));
  }
  // Saturating, so that a max_step_lag of "unlimited" does not wrap around.
  const uint64_t limit =
      limits_.max_step_lag > std::numeric_limits<uint64_t>::max() - newest_step_
          ? std::numeric_limits<uint64_t>::max()
          : newest_step_ + limits_.max_step_lag;
  if (step > limit) {
    return absl::OutOfRangeError(absl::StrCat(
        Aggregate::PushName(key, rank), ": step ", step,
        " is too far ahead: newest completed ", Aggregate::kKind, "step is ",
        newest_step_, ", max_step_lag ", limits_.max_step_lag));
  }
  return absl::OkStatus();
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::RetainLocked(const Key& key, Shape shape,
                                             const Result& result) {
  const uint64_t step = Aggregate::Step(key);
  StreamHistory& history = streams_[Aggregate::Stream(key)];
  history.by_step[step].insert_or_assign(key, RetainedRound{std::move(shape), result});
  while (history.by_step.size() > limits_.retained_rounds) {
    auto oldest = history.by_step.begin();
    history.newest_retired = history.retired_any
                                 ? std::max(history.newest_retired, oldest->first)
                                 : oldest->first;
    history.retired_any = true;
    history.by_step.erase(oldest);
  }
  ++rounds_completed_;
  ++completed_by_stream_[Aggregate::Stream(key)];
  newest_step_ = std::max(newest_step_, step);
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::CountFailureLocked(const Key& key) {
  ++rounds_failed_;
  ++failed_by_stream_[Aggregate::Stream(key)];
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::Answer(FailedRounds& failed) {
  for (auto& [status, waiters] : failed) {
    for (Callback& w : waiters) w(status);
  }
}

template <typename Aggregate>
int RoundLifecycle<Aggregate>::ExpireOverdue(absl::Time now) {
  FailedRounds failed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = open_.begin(); it != open_.end();) {
      Round& round = it->second;
      if (now < round.first_push + limits_.timeout) {
        ++it;
        continue;
      }
      std::vector<uint32_t> missing;
      for (uint32_t r = 0; r < limits_.world_size; ++r) {
        if (!round.pushed[r]) missing.push_back(r);
      }
      failed.emplace_back(
          absl::DeadlineExceededError(absl::StrCat(
              Aggregate::RoundName(it->first), " timed out after ",
              absl::ToDoubleSeconds(limits_.timeout), "s: missing ranks ",
              absl::StrJoin(missing, ", "), " of world_size ", limits_.world_size)),
          std::move(round.waiters));
      CountFailureLocked(it->first);
      it = open_.erase(it);
    }
  }
  Answer(failed);
  return static_cast<int>(failed.size());
}

template <typename Aggregate>
absl::Time RoundLifecycle<Aggregate>::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [key, round] : open_) {
    earliest = std::min(earliest, round.first_push + limits_.timeout);
  }
  return earliest;
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::FailAll(const std::string& reason) {
  FailedRounds failed;
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) {
      shut_down_ = true;
      shutdown_reason_ = reason;
    }
    for (auto& [key, round] : open_) {
      failed.emplace_back(absl::UnavailableError(
                              absl::StrCat(Aggregate::RoundName(key), " failed: ", reason)),
                          std::move(round.waiters));
      CountFailureLocked(key);
    }
    open_.clear();
  }
  Answer(failed);
}

template <typename Aggregate>
size_t RoundLifecycle<Aggregate>::open_rounds() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

template <typename Aggregate>
uint64_t RoundLifecycle<Aggregate>::rounds_completed() const {
  absl::MutexLock lock(&mu_);
  return rounds_completed_;
}

template <typename Aggregate>
uint64_t RoundLifecycle<Aggregate>::rounds_failed() const {
  absl::MutexLock lock(&mu_);
  return rounds_failed_;
}

template <typename Aggregate>
uint64_t RoundLifecycle<Aggregate>::rounds_completed(int stream) const {
  absl::MutexLock lock(&mu_);
  auto it = completed_by_stream_.find(stream);
  return it == completed_by_stream_.end() ? 0 : it->second;
}

template <typename Aggregate>
uint64_t RoundLifecycle<Aggregate>::rounds_failed(int stream) const {
  absl::MutexLock lock(&mu_);
  auto it = failed_by_stream_.find(stream);
  return it == failed_by_stream_.end() ? 0 : it->second;
}

template <typename Aggregate>
uint64_t RoundLifecycle<Aggregate>::newest_step() const {
  absl::MutexLock lock(&mu_);
  return newest_step_;
}

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_LIFECYCLE_H_
