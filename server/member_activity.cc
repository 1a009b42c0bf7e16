#include "server/member_activity.h"

#include <algorithm>

#include "common/status.h"

namespace cserps {

MemberActivity::MemberActivity(uint32_t world_size, absl::Duration silence_timeout)
    : silence_timeout_(silence_timeout), ranks_(world_size) {}

void MemberActivity::Heard(uint32_t rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (rank >= ranks_.size()) return;
  // Calls on other threads may report out of order; keep the newest.
  ranks_[rank].last_heard = std::max(ranks_[rank].last_heard, now);
}

void MemberActivity::CallStarted(uint32_t rank, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (rank >= ranks_.size()) return;
  ranks_[rank].last_heard = std::max(ranks_[rank].last_heard, now);
  ++ranks_[rank].calls_in_progress;
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
