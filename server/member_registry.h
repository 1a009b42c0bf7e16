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
  //
  // Elastic (`times_dropped`: how often each rank has been dropped so far):
  // a rank dropped since its holder registered goes to the worker id that
  // asks for it (requested, or the lowest such when requested < 0 and none
  // is free), a replacement taking the dead one's place; UNAVAILABLE instead
  // of ALREADY_EXISTS or RESOURCE_EXHAUSTED while its holder is still a
  // member, since the shard may yet drop it.
  absl::StatusOr<uint32_t> Register(int64_t requested, absl::string_view worker_id,
                                    const std::vector<uint32_t>* times_dropped = nullptr);

  bool IsRegistered(uint32_t rank) const;
  uint32_t registered() const;
  uint32_t world_size() const { return world_size_; }

 private:
  static uint32_t TimesDropped(const std::vector<uint32_t>* times_dropped, uint32_t rank);
  // Gives `rank` to `worker_id`; returns it.
  uint32_t TakeLocked(uint32_t rank, absl::string_view worker_id,
                      const std::vector<uint32_t>* times_dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t world_size_;
  mutable absl::Mutex mu_;
  std::vector<std::string> holder_ ABSL_GUARDED_BY(mu_);  // "" = free
  // By rank: its times_dropped when its holder registered (elastic).
  std::vector<uint32_t> drops_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_SERVER_MEMBER_REGISTRY_H_
