#include "server/round_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/open_rounds.h"

namespace cserps {
namespace {

std::string RoundName(const RoundKey& key) {
  return absl::StrCat("round (step ", key.step, ", stream ", key.stream,
                      ", chunk ", key.chunk,
                      key.ratio == 1 ? "" : absl::StrCat(", ratio ", key.ratio), ")");
}

std::string PushName(const RoundKey& key, uint32_t rank) {
  return absl::StrCat("push of rank ", rank, " to ", RoundName(key));
}

absl::Status LengthMismatch(const RoundKey& key, uint32_t rank, size_t got,
                            size_t want) {
  return absl::InvalidArgumentError(
      absl::StrCat(PushName(key, rank), ": values length ", got,
                   " differs from the round's length ", want));
}

}  // namespace

RoundTable::RoundTable(Options options) : options_(std::move(options)) {
  CSERPS_CHECK(options_.world_size >= 1);
}

const RoundMean* RoundTable::FindRetainedLocked(const RoundKey& key) const {
  auto stream = streams_.find(key.stream);
  if (stream == streams_.end()) return nullptr;
  auto step = stream->second.by_step.find(key.step);
  if (step == stream->second.by_step.end()) return nullptr;
  auto chunk = step->second.find({key.ratio, key.chunk});
  if (chunk == step->second.end()) return nullptr;
  return &chunk->second;
}

absl::Status RoundTable::CheckWindowLocked(const RoundKey& key,
                                           uint32_t rank) const {
  auto stream = streams_.find(key.stream);
  if (stream != streams_.end() && stream->second.retired_any &&
      key.step <= stream->second.newest_retired) {
    return absl::OutOfRangeError(absl::StrCat(
        PushName(key, rank), ": step ", key.step, " of stream ", key.stream,
        " is too far behind: rounds up to step ",
        stream->second.newest_retired, " are retired"));
  }
  // Saturating, so a max_step_lag of "unlimited" does not wrap around.
  const uint64_t limit =
      options_.max_step_lag > std::numeric_limits<uint64_t>::max() - newest_step_
          ? std::numeric_limits<uint64_t>::max()
          : newest_step_ + options_.max_step_lag;
  if (key.step > limit) {
    return absl::OutOfRangeError(absl::StrCat(
        PushName(key, rank), ": step ", key.step,
        " is too far ahead: newest completed step is ", newest_step_,
        ", max_step_lag ", options_.max_step_lag));
  }
  return absl::OkStatus();
}

std::vector<RoundCallback> RoundTable::FinishLocked(const RoundKey& key,
                                                    const RoundMean& mean) {
  auto node = completing_.extract(key);
  CSERPS_CHECK(!node.empty());
  std::vector<RoundCallback> waiters = std::move(node.mapped().waiters);

  StreamHistory& history = streams_[key.stream];
  history.by_step[key.step][{key.ratio, key.chunk}] = mean;
  while (history.by_step.size() > options_.retained_rounds) {
    auto oldest = history.by_step.begin();
    history.newest_retired = history.retired_any
                                 ? std::max(history.newest_retired, oldest->first)
                                 : oldest->first;
    history.retired_any = true;
    history.by_step.erase(oldest);
  }
  ++rounds_completed_;
  ++completed_by_stream_[key.stream];
  newest_step_ = std::max(newest_step_, key.step);
  return waiters;
}

RoundTable::~RoundTable() { FailAll("round table destroyed"); }

void RoundTable::Push(const RoundKey& key, uint32_t rank, float weight,
                      float lr, absl::Span<const float> values, absl::Time now,
                      RoundCallback done) {
  CSERPS_CHECK(done != nullptr);
  if (rank >= options_.world_size) {
    done(absl::InvalidArgumentError(
        absl::StrCat(PushName(key, rank), ": rank ", rank,
                     " is out of range for world_size ", options_.world_size)));
    return;
  }
  if (!std::isfinite(weight) || !(weight > 0.0f)) {
    done(absl::InvalidArgumentError(
        absl::StrCat(PushName(key, rank), ": weight ", weight,
                     " must be finite and > 0")));
    return;
  }

  absl::Status refused;
  RoundMean retained;
  Round completed;  // filled when this push completes the round
  bool completes = false;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      refused = absl::UnavailableError(
          absl::StrCat(PushName(key, rank), " refused: ", shutdown_reason_));
    } else if (const RoundMean* mean = FindRetainedLocked(key)) {
      if ((*mean)->size() != values.size()) {
        refused = LengthMismatch(key, rank, values.size(), (*mean)->size());
      } else {
        retained = *mean;
      }
    } else if (auto c = completing_.find(key); c != completing_.end()) {
      if (c->second.length != values.size()) {
        refused = LengthMismatch(key, rank, values.size(), c->second.length);
      } else {
        c->second.waiters.push_back(std::move(done));
        return;
      }
    } else {
      auto it = open_.find(key);
      if (it == open_.end()) {
        refused = CheckWindowLocked(key, rank);
        if (refused.ok()) {
          it = open_.emplace(key, Round{}).first;
          Round& round = it->second;
          round.sum.assign(values.size(), 0.0);
          round.pushed.assign(options_.world_size, false);
          round.first_push = now;
          round.lr = lr;
        }
      }
      if (refused.ok()) {
        Round& round = it->second;
        if (round.sum.size() != values.size()) {
          refused = LengthMismatch(key, rank, values.size(), round.sum.size());
        } else {
          if (!round.pushed[rank]) {
            const double w = weight;
            for (size_t i = 0; i < values.size(); ++i) {
              round.sum[i] += w * static_cast<double>(values[i]);
            }
            round.weight_total += w;
            round.pushed[rank] = true;
            ++round.ranks_pushed;
          }
          round.waiters.push_back(std::move(done));
          if (round.ranks_pushed < options_.world_size) return;
          // The round stays visible as completing until on_complete has
          // returned, so a retry in between neither starts a new round nor
          // is answered before the shard has applied the mean.
          completed = std::move(round);
          open_.erase(it);
          completing_[key].length = completed.sum.size();
          completes = true;
        }
      }
    }
  }
  if (!refused.ok()) {
    done(std::move(refused));
    return;
  }
  if (!completes) {
    done(std::move(retained));
    return;
  }

  // Nothing else touches the accumulator once the round left open_, so the
  // mean is computed without the lock.
  auto mean_values = std::make_shared<std::vector<float>>(completed.sum.size());
  for (size_t i = 0; i < completed.sum.size(); ++i) {
    (*mean_values)[i] =
        static_cast<float>(completed.sum[i] / completed.weight_total);
  }
  RoundMean mean = std::move(mean_values);
  if (options_.on_complete) options_.on_complete(key, completed.lr, *mean);

  std::vector<RoundCallback> waiters = std::move(completed.waiters);
  {
    absl::MutexLock lock(&mu_);
    std::vector<RoundCallback> joined = FinishLocked(key, mean);
    for (RoundCallback& w : joined) waiters.push_back(std::move(w));
  }
  for (RoundCallback& w : waiters) w(mean);
}

int RoundTable::ExpireOverdue(absl::Time now) {
  FailedRounds<RoundCallback> failed;
  {
    absl::MutexLock lock(&mu_);
    for (const RoundKey& key : TakeOverdue(open_, now, options_.timeout,
                                           options_.world_size, RoundName, &failed)) {
      ++rounds_failed_;
      ++failed_by_stream_[key.stream];
    }
  }
  failed.Answer();
  return failed.size();
}

absl::Time RoundTable::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  return EarliestDeadline(open_, options_.timeout);
}

void RoundTable::FailAll(const std::string& reason) {
  FailedRounds<RoundCallback> failed;
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) {
      shut_down_ = true;
      shutdown_reason_ = reason;
    }
    for (const RoundKey& key : TakeAll(open_, reason, RoundName, &failed)) {
      ++rounds_failed_;
      ++failed_by_stream_[key.stream];
    }
  }
  failed.Answer();
}

size_t RoundTable::open_rounds() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

uint64_t RoundTable::rounds_completed() const {
  absl::MutexLock lock(&mu_);
  return rounds_completed_;
}

uint64_t RoundTable::rounds_failed() const {
  absl::MutexLock lock(&mu_);
  return rounds_failed_;
}

uint64_t RoundTable::rounds_completed(int stream) const {
  absl::MutexLock lock(&mu_);
  auto it = completed_by_stream_.find(stream);
  return it == completed_by_stream_.end() ? 0 : it->second;
}

uint64_t RoundTable::rounds_failed(int stream) const {
  absl::MutexLock lock(&mu_);
  auto it = failed_by_stream_.find(stream);
  return it == failed_by_stream_.end() ? 0 : it->second;
}

uint64_t RoundTable::newest_step() const {
  absl::MutexLock lock(&mu_);
  return newest_step_;
}

}  // namespace cserps
