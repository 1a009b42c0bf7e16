#include "worker/trainer/roll_back.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace cserps {
namespace {

constexpr absl::Duration kFirstPoll = absl::Milliseconds(20);
constexpr absl::Duration kLongestPoll = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::optional<RestartedShard>> FindRestartedShard(PsClient& client,
                                                                 uint64_t followed,
                                                                 absl::Duration patience) {
  const absl::Time deadline = absl::Now() + patience;
  absl::Duration poll = kFirstPoll;
  // Bounded by the deadline; the count only guards against a clock that
  // does not move.
  for (int attempt = 0; attempt < 100000; ++attempt) {
    bool silent = false;
    for (uint32_t s = 0; s < client.layout().num_shards(); ++s) {
      const absl::StatusOr<v1::GetStatusResponse> status = client.GetStatus(s);
      if (!status.ok()) {
        silent = true;
        continue;
      }
      RestartedShard found{s, false, 0, status->resumed_from_step()};
      if (status->incarnation() != client.incarnation(s)) {
        found.restarted = true;
        found.incarnation = status->incarnation();
      } else if (status->rolled_back_for() != 0 && status->rolled_back_for() != followed) {
        found.incarnation = status->rolled_back_for();
      } else {
        continue;
      }
      if (found.step == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", s, " restarted without a checkpoint (it started fresh): the job cannot go "
            "on; restart every process of it"));
      }
      return found;
    }
    if (!silent || absl::Now() + poll > deadline) break;
    absl::SleepFor(poll);
    poll = std::min(2 * poll, kLongestPoll);
  }
  return std::nullopt;
}

absl::Status RollBackShards(PsClient& client, const RestartedShard& restarted) {
  for (uint32_t s = 0; s < client.layout().num_shards(); ++s) {
    RETURN_IF_ERROR(client.RollBack(s, restarted.step, restarted.incarnation));
  }
  return absl::OkStatus();
}

}  // namespace cserps
