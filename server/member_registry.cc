#include "server/member_registry.h"

#include "absl/strings/str_cat.h"

namespace cserps {

MemberRegistry::MemberRegistry(uint32_t world_size)
    : world_size_(world_size), holder_(world_size), drops_seen_(world_size, 0) {}

absl::StatusOr<uint32_t> MemberRegistry::Register(int64_t requested,
                                                  absl::string_view worker_id,
                                                  const std::vector<uint32_t>* times_dropped) {
  if (worker_id.empty()) {
    return absl::InvalidArgumentError("worker_id must not be empty");
  }
  if (requested >= static_cast<int64_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "requested rank ", requested, " is out of range: the job has ",
        world_size_, " workers (ranks 0..", world_size_ - 1, ")"));
  }
  absl::MutexLock lock(&mu_);
  auto take = [&](uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return TakeLocked(r, worker_id, times_dropped);
  };
  auto replaceable = [&](uint32_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return TimesDropped(times_dropped, r) > drops_seen_[r];
  };
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (holder_[r] != worker_id) continue;
    if (requested < 0 || requested == r) return take(r);
    return absl::AlreadyExistsError(absl::StrCat(
        "worker \"", worker_id, "\" already holds rank ", r,
        " and cannot also take rank ", requested));
  }
  if (requested >= 0) {
    const uint32_t r = static_cast<uint32_t>(requested);
    if (holder_[r].empty() || replaceable(r)) return take(r);
    const std::string held =
        absl::StrCat("rank ", requested, " is already registered by worker \"", holder_[r], "\"");
    if (times_dropped == nullptr) return absl::AlreadyExistsError(held);
    return absl::UnavailableError(absl::StrCat(
        held, ", a member of the rounds: a replacement takes it once the shard drops it (at a "
        "round's timeout)"));
  }
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (holder_[r].empty()) return take(r);
  }
  for (uint32_t r = 0; times_dropped != nullptr && r < world_size_; ++r) {
    if (replaceable(r)) return take(r);
  }
  const std::string all = absl::StrCat("all ", world_size_, " ranks of the job are registered");
  if (times_dropped == nullptr) return absl::ResourceExhaustedError(all);
  return absl::UnavailableError(absl::StrCat(
      all, " and members of the rounds: a replacement takes the rank of one the shard drops "
      "(at a round's timeout)"));
}

uint32_t MemberRegistry::TimesDropped(const std::vector<uint32_t>* times_dropped, uint32_t rank) {
  return times_dropped != nullptr && rank < times_dropped->size() ? (*times_dropped)[rank] : 0;
}

uint32_t MemberRegistry::TakeLocked(uint32_t rank, absl::string_view worker_id,
                                    const std::vector<uint32_t>* times_dropped) {
  holder_[rank] = std::string(worker_id);
  drops_seen_[rank] = TimesDropped(times_dropped, rank);
  return rank;
}

bool MemberRegistry::IsRegistered(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return rank < world_size_ && !holder_[rank].empty();
}

uint32_t MemberRegistry::registered() const {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const std::string& h : holder_) n += h.empty() ? 0 : 1;
  return n;
}

}  // namespace cserps
