#include "server/async_staleness_gate.h"

#include <algorithm>
#include <utility>

namespace cserps {
namespace {

constexpr int64_t kMostShifted = int64_t{1} << 62;

}  // namespace

StalenessGate::StalenessGate(Options options)
    : options_(options), ranks_(options.world_size) {}

int64_t StalenessGate::SlowestLiveLocked() const {
  int64_t slowest = INT64_MAX;
  for (const RankState& r : ranks_) {
    if (!r.dead) slowest = std::min(slowest, r.newest_step);
  }
  return slowest;
}

bool StalenessGate::AdmitsLocked(int64_t step) const {
  if (options_.staleness == 0) return true;
  const int64_t slowest = SlowestLiveLocked();
  // Every rank dead cannot happen while a push waits (its own rank is live);
  // admit rather than wait forever.
  if (slowest == INT64_MAX) return true;
  return step <= slowest + static_cast<int64_t>(options_.staleness);
}

void StalenessGate::CollectAdmittedLocked(absl::Time now, std::vector<Release>* out) {
  auto keep = parked_.begin();
  for (auto it = parked_.begin(); it != parked_.end(); ++it) {
    if (AdmitsLocked(it->step)) {
      // Waiting was not silence: its silence starts now.
      ranks_[it->rank].last_heard = std::max(ranks_[it->rank].last_heard, now);
      out->push_back(std::move(it->release));
    } else {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    }
  }
  parked_.erase(keep, parked_.end());
}

void StalenessGate::Arrive(uint32_t rank, uint64_t step, absl::Time now,
                           Release release) {
  std::vector<Release> ready;
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    failed = failed_;
    if (failed.ok()) {
      if (!started_) {
        started_ = true;
        for (RankState& r : ranks_) r.last_heard = now;
      }
      RankState& me = ranks_[rank];
      if (me.dead) {
        // Back from the dead, it counts from where the slowest of the
        // others is: counted from its own old step it would hold them back
        // until it had caught up, far longer than any call's deadline.
        const int64_t slowest = SlowestLiveLocked();
        if (slowest != INT64_MAX) {
          me.shift = std::max(me.shift, slowest - static_cast<int64_t>(step));
        }
        me.dead = false;
      }
      // Held at 2^62, as steps are: a step and a shift, each below it, and
      // m + s stay inside int64.
      const int64_t at = std::min(static_cast<int64_t>(step) + me.shift, kMostShifted);
      me.last_heard = std::max(me.last_heard, now);
      me.newest_step = std::max(me.newest_step, at);
      if (AdmitsLocked(at)) {
        ready.push_back(std::move(release));
      } else {
        parked_.push_back(Parked{rank, at, std::move(release)});
      }
      CollectAdmittedLocked(now, &ready);
    }
  }
  if (!failed.ok()) {
    release(failed);
    return;
  }
  for (Release& r : ready) r(absl::OkStatus());
}

int StalenessGate::ExpireSilentRanks(absl::Time now) {
  std::vector<Release> ready;
  int expired = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || !failed_.ok()) return 0;
    std::vector<bool> waiting(ranks_.size(), false);
    for (const Parked& p : parked_) waiting[p.rank] = true;
    for (uint32_t q = 0; q < ranks_.size(); ++q) {
      RankState& r = ranks_[q];
      if (!r.dead && !waiting[q] && now - r.last_heard >= options_.silence_timeout) {
        r.dead = true;
        ++expired;
      }
    }
    if (expired > 0) CollectAdmittedLocked(now, &ready);
  }
  for (Release& r : ready) r(absl::OkStatus());
  return expired;
}

void StalenessGate::FailAll(const absl::Status& reason) {
  std::vector<Parked> parked;
  {
    absl::MutexLock lock(&mu_);
    failed_ = reason;
    parked.swap(parked_);
  }
  for (Parked& p : parked) p.release(reason);
}

size_t StalenessGate::parked() const {
  absl::MutexLock lock(&mu_);
  return parked_.size();
}

bool StalenessGate::WaitForParked(size_t count, absl::Duration timeout) const {
  struct Enough {
    const std::vector<Parked>* parked;
    size_t count;
    bool operator()() const { return parked->size() >= count; }
  };
  absl::MutexLock lock(&mu_);
  const Enough enough{&parked_, count};
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

std::vector<uint32_t> StalenessGate::DeadRanks() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint32_t> dead;
  for (uint32_t q = 0; q < ranks_.size(); ++q) {
    if (ranks_[q].dead) dead.push_back(q);
  }
  return dead;
}

}  // namespace cserps
