// The definitions of RoundLifecycle's members (round_lifecycle.h). Only
// the files that instantiate it include this: round_table.cc and
// sparse_round_table.cc; everyone else sees the `extern template`
// declarations next to WeightedSum and SparsePushes.
#ifndef CSERPS_SERVER_ROUND_LIFECYCLE_IMPL_H_
#define CSERPS_SERVER_ROUND_LIFECYCLE_IMPL_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "server/round_lifecycle.h"

namespace cserps {

template <typename Aggregate>
RoundLifecycle<Aggregate>::RoundLifecycle(RoundLimits limits, Finish finish)
    : limits_(limits),
      finish_(std::move(finish)),
      newest_step_(limits.first_step),
      member_(limits.world_size, true),
      admitted_at_(limits.world_size),
      members_(limits.world_size) {
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
                                           Callback done, CountPush count) {
  CSERPS_CHECK(done != nullptr);
  absl::Status refused =
      rank >= limits_.world_size
          ? absl::InvalidArgumentError(absl::StrCat(
                Aggregate::PushName(key, rank), ": rank ", rank,
                " is out of range for world_size ", limits_.world_size))
          : Aggregate::Check(key, rank, contribution);
  if (!refused.ok()) {
    count(false);
    done(std::move(refused));
    return;
  }
  const Shape shape = Aggregate::ShapeOf(contribution);
  std::optional<Result> retained;
  RoundNode completed;  // when this push completes it
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      refused = absl::UnavailableError(
          absl::StrCat(Aggregate::PushName(key, rank), " refused: ", shutdown_reason_));
    } else if (restarting_) {
      refused = absl::AbortedError(absl::StrCat(Aggregate::PushName(key, rank),
                                                " refused: the shard is rolling back"));
    } else if (absl::Status admitted = limits_.admitted ? limits_.admitted(rank)
                                                         : absl::OkStatus();
               !admitted.ok()) {
      refused = absl::Status(admitted.code(), absl::StrCat(Aggregate::PushName(key, rank),
                                                           " refused: ", admitted.message()));
    } else if (!member_[rank]) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          Aggregate::PushName(key, rank), " refused: rank ", rank,
          " was dropped from the job (elastic: it missed a round's timeout); the rounds go on "
          "with the other ", members_, " members"));
    } else if (!ExpectsLocked(key, rank)) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          Aggregate::PushName(key, rank), " refused: rank ", rank,
          " was admitted back from the rounds of step ", *admitted_at_[rank],
          " after its full average"));
    } else if (const RetainedRound* r = FindRetainedLocked(key)) {
      refused = Aggregate::CheckShape(key, rank, shape, r->shape);
      if (refused.ok()) retained = r->result;
    } else if (auto c = completing_.find(key); c != completing_.end()) {
      refused = Aggregate::CheckShape(key, rank, shape, c->second.shape);
      if (refused.ok()) c->second.waiters.push_back(std::move(done));
    } else {
      auto it = open_.find(key);
      if (it == open_.end()) {
        refused = CheckWindowLocked(key, rank);
        if (refused.ok()) {
          it = open_.try_emplace(key, contribution, ExpectedLocked(key), limits_.world_size, now)
                   .first;
        }
      }
      if (refused.ok()) refused = Aggregate::CheckShape(key, rank, shape, it->second.shape);
      if (refused.ok()) {
        Round& round = it->second;
        if (!round.pushed[rank]) {
          round.aggregate.Add(rank, std::move(contribution));
          round.pushed[rank] = true;
        }
        round.waiters.push_back(std::move(done));
        if (CompleteLocked(key, round)) completed = ExtractCompletingLocked(it);
      }
    }
    // Under mu_: once it is released, another push may complete the round
    // and answer this one.
    count(refused.ok());
  }
  if (!refused.ok()) {
    done(std::move(refused));
  } else if (retained.has_value()) {
    done(*std::move(retained));
  } else if (!completed.empty()) {
    FinishRound(std::move(completed), now);
  }
}

template <typename Aggregate>
bool RoundLifecycle<Aggregate>::ExpectsLocked(const Key& key, uint32_t rank) const {
  if (!member_[rank]) return false;
  const std::optional<uint64_t>& since = admitted_at_[rank];
  return !since.has_value() || JoinsFrom(key, *since);
}

template <typename Aggregate>
bool RoundLifecycle<Aggregate>::JoinsFrom(const Key& key, uint64_t since) {
  const uint64_t step = Aggregate::Step(key);
  return step > since ||
         (step == since && Aggregate::Stream(key) != Aggregate::kFullAverageStream);
}

template <typename Aggregate>
uint32_t RoundLifecycle<Aggregate>::ExpectedLocked(const Key& key) const {
  uint32_t n = 0;
  for (uint32_t r = 0; r < limits_.world_size; ++r) n += ExpectsLocked(key, r) ? 1 : 0;
  return n;
}

template <typename Aggregate>
bool RoundLifecycle<Aggregate>::CompleteLocked(const Key& key, const Round& round) const {
  for (uint32_t r = 0; r < limits_.world_size; ++r) {
    if (ExpectsLocked(key, r) && !round.pushed[r]) return false;
  }
  return true;
}

template <typename Aggregate>
auto RoundLifecycle<Aggregate>::ExtractCompletingLocked(typename std::map<Key, Round>::iterator it)
    -> RoundNode {
  RoundNode node = open_.extract(it);
  completing_[node.key()].shape = node.mapped().shape;
  return node;
}

template <typename Aggregate>
void RoundLifecycle<Aggregate>::FinishRound(RoundNode completed, absl::Time now) {
  // Nothing else touches the round once it left open_.
  const Key key = completed.key();
  Round& round = completed.mapped();
  const Result result = finish_(key, std::move(round.aggregate), now - round.first_push);
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
  std::vector<RoundNode> completed;
  std::vector<std::pair<std::vector<uint32_t>, std::string>> drops;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = open_.begin(); it != open_.end();) {
      Round& round = it->second;
      if (now < round.first_push + limits_.timeout) {
        ++it;
        continue;
      }
      std::vector<uint32_t> missing;
      bool a_member_pushed = false;
      for (uint32_t r = 0; r < limits_.world_size; ++r) {
        if (ExpectsLocked(it->first, r) && !round.pushed[r]) missing.push_back(r);
        if (ExpectsLocked(it->first, r) && round.pushed[r]) a_member_pushed = true;
      }
      if (limits_.elastic && a_member_pushed) {
        // None missing: it waited only for members another overdue round
        // has just dropped.
        if (!missing.empty()) {
          for (uint32_t r : missing) {
            member_[r] = false;
            admitted_at_[r].reset();
            dropped_.push_back(r);
          }
          members_ -= static_cast<uint32_t>(missing.size());
          drops.emplace_back(std::move(missing), Aggregate::RoundName(it->first));
        }
        const auto next = std::next(it);
        completed.push_back(ExtractCompletingLocked(it));
        it = next;
        continue;
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
    // Rounds that waited only for the members just dropped.
    for (auto it = open_.begin(); !drops.empty() && it != open_.end();) {
      const auto next = std::next(it);
      if (CompleteLocked(it->first, it->second)) completed.push_back(ExtractCompletingLocked(it));
      it = next;
    }
  }
  if (on_dropped_) {
    for (const auto& [ranks, round] : drops) on_dropped_(ranks, round);
  }
  Answer(failed);
  for (RoundNode& node : completed) FinishRound(std::move(node), now);
  return static_cast<int>(failed.size() + drops.size());
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
absl::Status RoundLifecycle<Aggregate>::Restart(uint64_t first_step, const std::string& reason,
                                                const std::function<absl::Status()>& reload) {
  FailedRounds failed;
  {
    absl::MutexLock lock(&mu_);
    restarting_ = true;
    for (auto& [key, round] : open_) {
      // Not counted as failed: no process of the job died here.
      failed.emplace_back(absl::AbortedError(
                              absl::StrCat(Aggregate::RoundName(key), " aborted: ", reason)),
                          std::move(round.waiters));
    }
    open_.clear();
    // A completing round still applies its result to the model.
    mu_.Await(absl::Condition(
        +[](std::map<Key, CompletingRound>* c) { return c->empty(); }, &completing_));
  }
  Answer(failed);
  const absl::Status reloaded = reload();
  absl::MutexLock lock(&mu_);
  streams_.clear();
  newest_step_ = first_step;
  restarting_ = false;
  // The model is now neither the rounds' nor the checkpoint's.
  if (!reloaded.ok() && !shut_down_) {
    shut_down_ = true;
    shutdown_reason_ = absl::StrCat("the shard's roll back failed: ", reloaded.message());
  }
  return reloaded;
}

template <typename Aggregate>
size_t RoundLifecycle<Aggregate>::open_rounds() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

template <typename Aggregate>
bool RoundLifecycle<Aggregate>::WaitForWaitingCalls(size_t count, absl::Duration timeout) const {
  struct Enough {
    const std::map<Key, Round>* open;
    size_t count;
    bool operator()() const {
      size_t waiting = 0;
      for (const auto& [key, round] : *open) waiting += round.waiters.size();
      return waiting >= count;
    }
  };
  absl::MutexLock lock(&mu_);
  const Enough enough{&open_, count};
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
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

template <typename Aggregate>
absl::Status RoundLifecycle<Aggregate>::Admit(uint32_t rank, uint64_t step) {
  if (rank >= limits_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank,
                                                   " is out of range for world_size ",
                                                   limits_.world_size));
  }
  if (!limits_.elastic) {
    return absl::FailedPreconditionError(
        "this job is not elastic (cluster.elastic): its members never change");
  }
  absl::MutexLock lock(&mu_);
  if (member_[rank]) {
    if (admitted_at_[rank] == step) return absl::OkStatus();
    return absl::FailedPreconditionError(
        admitted_at_[rank].has_value()
            ? absl::StrCat("rank ", rank, " is already admitted back from step ",
                           *admitted_at_[rank])
            : absl::StrCat("rank ", rank, " is still a member: it is admitted back once it "
                           "is dropped (a round without it times out)"));
  }
  if (newest_step_ >= step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " cannot be admitted from step ", step, ": ", Aggregate::kKind,
        "rounds up to step ", newest_step_, " have completed"));
  }
  // Its aggregate counts the pushes of the members it began with.
  auto begun = [&](const Key& key) -> absl::Status {
    if (!JoinsFrom(key, step)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " cannot be admitted from step ", step, ": ",
                     Aggregate::RoundName(key), " has begun without it"));
  };
  for (const auto& [key, round] : open_) RETURN_IF_ERROR(begun(key));
  for (const auto& [key, round] : completing_) RETURN_IF_ERROR(begun(key));
  member_[rank] = true;
  admitted_at_[rank] = step;
  ++members_;
  admitted_.push_back(rank);
  return absl::OkStatus();
}

template <typename Aggregate>
std::vector<uint32_t> RoundLifecycle<Aggregate>::admitted_ranks() const {
  absl::MutexLock lock(&mu_);
  return admitted_;
}

template <typename Aggregate>
std::vector<uint32_t> RoundLifecycle<Aggregate>::times_dropped() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> times(limits_.world_size, 0);
  for (uint32_t r : dropped_) ++times[r];
  return times;
}

template <typename Aggregate>
uint32_t RoundLifecycle<Aggregate>::members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

template <typename Aggregate>
std::vector<uint32_t> RoundLifecycle<Aggregate>::dropped_ranks() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_LIFECYCLE_IMPL_H_
