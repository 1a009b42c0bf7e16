#include "server/sparse_round_table.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/open_rounds.h"

namespace cserps {
namespace {

std::string RoundName(uint64_t step) { return absl::StrCat("sparse round of step ", step); }

std::string PushName(uint64_t step, uint32_t rank) {
  return absl::StrCat("sparse push of rank ", rank, " for step ", step);
}

}  // namespace

SparseRoundTable::SparseRoundTable(Options options) : options_(std::move(options)) {
  CSERPS_CHECK(options_.world_size >= 1);
  CSERPS_CHECK(options_.complete != nullptr);
}

SparseRoundTable::~SparseRoundTable() { FailAll("sparse round table destroyed"); }

absl::Status SparseRoundTable::CheckWindowLocked(uint64_t step, uint32_t rank) const {
  if (retired_any_ && step <= newest_retired_) {
    return absl::OutOfRangeError(absl::StrCat(
        PushName(step, rank), ": step ", step,
        " is too far behind: sparse rounds up to step ", newest_retired_,
        " are retired"));
  }
  const uint64_t limit =
      options_.max_step_lag > std::numeric_limits<uint64_t>::max() - newest_step_
          ? std::numeric_limits<uint64_t>::max()
          : newest_step_ + options_.max_step_lag;
  if (step > limit) {
    return absl::OutOfRangeError(absl::StrCat(
        PushName(step, rank), ": step ", step,
        " is too far ahead: newest completed sparse step is ", newest_step_,
        ", max_step_lag ", options_.max_step_lag));
  }
  return absl::OkStatus();
}

void SparseRoundTable::Push(uint64_t step, uint32_t rank, SparseEntries entries,
                            absl::Time now, SparseRoundCallback done) {
  CSERPS_CHECK(done != nullptr);
  if (rank >= options_.world_size) {
    done(absl::InvalidArgumentError(absl::StrCat(
        PushName(step, rank), ": rank ", rank, " is out of range for world_size ",
        options_.world_size)));
    return;
  }
  absl::Status refused;
  SparseRoundReply retained;
  Round completed;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      refused = absl::UnavailableError(
          absl::StrCat(PushName(step, rank), " refused: ", shutdown_reason_));
    } else if (auto r = retained_.find(step); r != retained_.end()) {
      retained = r->second;
    } else if (auto c = completing_.find(step); c != completing_.end()) {
      c->second.push_back(std::move(done));
      return;
    } else {
      auto it = open_.find(step);
      if (it == open_.end()) {
        refused = CheckWindowLocked(step, rank);
        if (refused.ok()) {
          it = open_.emplace(step, Round{}).first;
          it->second.pushes.resize(options_.world_size);
          it->second.pushed.assign(options_.world_size, false);
          it->second.first_push = now;
        }
      }
      if (refused.ok()) {
        Round& round = it->second;
        if (!round.pushed[rank]) {
          round.pushes[rank] = std::move(entries);
          round.pushed[rank] = true;
          ++round.ranks_pushed;
        }
        round.waiters.push_back(std::move(done));
        if (round.ranks_pushed < options_.world_size) return;
        completed = std::move(round);
        open_.erase(it);
        completing_[step];
      }
    }
  }
  if (!refused.ok()) {
    done(std::move(refused));
    return;
  }
  if (retained != nullptr) {
    done(std::move(retained));
    return;
  }

  // This push completed the round; nothing else touches its pushes now.
  SparseRoundReply reply = std::make_shared<const SparseReply>(
      options_.complete(step, std::move(completed.pushes)));
  if (options_.on_latency) options_.on_latency(now - completed.first_push);
  std::vector<SparseRoundCallback> waiters = std::move(completed.waiters);
  {
    absl::MutexLock lock(&mu_);
    auto node = completing_.extract(step);
    CSERPS_CHECK(!node.empty());
    for (SparseRoundCallback& w : node.mapped()) waiters.push_back(std::move(w));
    retained_[step] = reply;
    while (retained_.size() > options_.retained_rounds) {
      auto oldest = retained_.begin();
      newest_retired_ = retired_any_ ? std::max(newest_retired_, oldest->first)
                                     : oldest->first;
      retired_any_ = true;
      retained_.erase(oldest);
    }
    ++rounds_completed_;
    newest_step_ = completed_any_ ? std::max(newest_step_, step) : step;
    completed_any_ = true;
  }
  for (SparseRoundCallback& w : waiters) w(reply);
}

int SparseRoundTable::ExpireOverdue(absl::Time now) {
  FailedRounds<SparseRoundCallback> failed;
  {
    absl::MutexLock lock(&mu_);
    rounds_failed_ +=
        TakeOverdue(open_, now, options_.timeout, options_.world_size, RoundName, &failed)
            .size();
  }
  failed.Answer();
  return failed.size();
}

absl::Time SparseRoundTable::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  return EarliestDeadline(open_, options_.timeout);
}

void SparseRoundTable::FailAll(const std::string& reason) {
  FailedRounds<SparseRoundCallback> failed;
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) {
      shut_down_ = true;
      shutdown_reason_ = reason;
    }
    rounds_failed_ += TakeAll(open_, reason, RoundName, &failed).size();
  }
  failed.Answer();
}

size_t SparseRoundTable::open_rounds() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

uint64_t SparseRoundTable::rounds_completed() const {
  absl::MutexLock lock(&mu_);
  return rounds_completed_;
}

uint64_t SparseRoundTable::rounds_failed() const {
  absl::MutexLock lock(&mu_);
  return rounds_failed_;
}

uint64_t SparseRoundTable::newest_step() const {
  absl::MutexLock lock(&mu_);
  return newest_step_;
}

}  // namespace cserps
