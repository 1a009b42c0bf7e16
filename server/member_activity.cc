#include "server/member_activity.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

MemberActivity::MemberActivity(uint32_t world_size, absl::Duration silence_timeout,
                               uint32_t max_calls_per_rank)
    : silence_timeout_(silence_timeout),
      max_calls_per_rank_(max_calls_per_rank),
      ranks_(world_size) {}

void MemberActivity::Heard(uint32_t rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (rank >= ranks_.size()) return;
  // Calls on other threads may report out of order; keep the newest.
  ranks_[rank].last_heard = std::max(ranks_[rank].last_heard, now);
}

absl::Status MemberActivity::CallStarted(uint32_t rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (rank >= ranks_.size()) return absl::OkStatus();
  Rank& r = ranks_[rank];
  r.last_heard = std::max(r.last_heard, now);
  if (r.calls_in_progress >= max_calls_per_rank_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rank ", rank, " already has ", r.calls_in_progress,
        " calls waiting on this shard, the most one member may have: is it sending calls "
        "again without waiting for their answers?"));
  }
  ++r.calls_in_progress;
  return absl::OkStatus();
}

void MemberActivity::CallEnded(uint32_t rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (rank >= ranks_.size()) return;
  Rank& r = ranks_[rank];
  CSERPS_CHECK(r.calls_in_progress > 0);
  --r.calls_in_progress;
  // Waiting was not silence: its silence starts when it is answered.
  r.last_heard = std::max(r.last_heard, now);
}

uint32_t MemberActivity::Alive(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  uint32_t alive = 0;
  for (const Rank& r : ranks_) {
    if (r.calls_in_progress > 0 || now - r.last_heard < silence_timeout_) ++alive;
  }
  return alive;
}

}  // namespace cserps
