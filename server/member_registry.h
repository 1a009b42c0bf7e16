// Which ranks of the job have registered with this shard, and by whom.
// Thread-safe.
#ifndef CSERPS_SERVER_MEMBER_REGISTRY_H_
#define CSERPS_SERVER_MEMBER_REGISTRY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace cserps {

class MemberRegistry {
 public:
  explicit MemberRegistry(uint32_t world_size);

  // Gives `worker_id` the rank `requested` (or the lowest free rank when
  // requested < 0). The same worker_id registering again gets its rank back.
  // INVALID_ARGUMENT: requested >= world size. ALREADY_EXISTS: the rank is
  // held by another worker id (named), or worker_id already holds another
  // rank. RESOURCE_EXHAUSTED: every rank taken.
  absl::StatusOr<uint32_t> Register(int64_t requested, absl::string_view worker_id);

  bool IsRegistered(uint32_t rank) const;
  uint32_t registered() const;
  uint32_t world_size() const { return world_size_; }

 private:
  const uint32_t world_size_;
  mutable absl::Mutex mu_;
  std::vector<std::string> holder_ ABSL_GUARDED_BY(mu_);  // "" = free
};

}  // namespace cserps

#endif  // CSERPS_SERVER_MEMBER_REGISTRY_H_
