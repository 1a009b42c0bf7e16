#include "server/member_registry.h"

#include "absl/strings/str_cat.h"

namespace cserps {

MemberRegistry::MemberRegistry(uint32_t world_size)
    : world_size_(world_size), holder_(world_size) {}

absl::StatusOr<uint32_t> MemberRegistry::Register(int64_t requested,
                                                  absl::string_view worker_id) {
  if (worker_id.empty()) {
    return absl::InvalidArgumentError("worker_id must not be empty");
  }
  if (requested >= static_cast<int64_t>(world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "requested rank ", requested, " is out of range: the job has ",
        world_size_, " workers (ranks 0..", world_size_ - 1, ")"));
  }
  absl::MutexLock lock(&mu_);
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (holder_[r] != worker_id) continue;
    if (requested < 0 || requested == r) return r;
    return absl::AlreadyExistsError(absl::StrCat(
        "worker \"", worker_id, "\" already holds rank ", r,
        " and cannot also take rank ", requested));
  }
  if (requested >= 0) {
    std::string& holder = holder_[requested];
    if (!holder.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", requested, " is already registered by worker \"", holder,
          "\""));
    }
    holder = std::string(worker_id);
    return static_cast<uint32_t>(requested);
  }
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (holder_[r].empty()) {
      holder_[r] = std::string(worker_id);
      return r;
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "all ", world_size_, " ranks of the job are registered"));
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
