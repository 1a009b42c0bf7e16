#include "worker/trainer/rejoin.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace cserps {
namespace {

constexpr absl::Duration kFirstPoll = absl::Milliseconds(20);
constexpr absl::Duration kLongestPoll = absl::Milliseconds(500);

// Every shard's status; a client of a rejoining worker talks to them all
// (cluster.local_size 1).
absl::StatusOr<std::vector<v1::GetStatusResponse>> Statuses(PsClient& client) {
  std::vector<v1::GetStatusResponse> statuses;
  for (uint32_t s = 0; s < client.layout().num_shards(); ++s) {
    ASSIGN_OR_RETURN(v1::GetStatusResponse status, client.GetStatus(s));
    statuses.push_back(std::move(status));
  }
  return statuses;
}

// Whether the shard of `status` counts `rank` among its members: it was
// admitted back as often as it was dropped.
bool IsMember(const v1::GetStatusResponse& status, uint32_t rank) {
  const auto dropped = std::count(status.dropped_ranks().begin(), status.dropped_ranks().end(), rank);
  const auto admitted =
      std::count(status.admitted_ranks().begin(), status.admitted_ranks().end(), rank);
  return dropped == admitted;
}

}  // namespace

absl::StatusOr<bool> JobUnderWay(PsClient& client) {
  ASSIGN_OR_RETURN(const std::vector<v1::GetStatusResponse> statuses, Statuses(client));
  for (const v1::GetStatusResponse& status : statuses) {
    if (status.rounds_completed() > 0) return true;
  }
  return false;
}

absl::StatusOr<uint64_t> AwaitAdmission(PsClient& client, const v1::JobConfig& config,
                                        uint64_t total_steps, absl::Duration patience,
                                        const std::string& log_prefix) {
  const uint64_t every = config.cluster().admit_every_steps();
  const uint32_t rank = client.rank();
  const absl::Duration stall = absl::Seconds(config.cluster().round_timeout_s()) + patience;
  uint64_t newest_seen = 0;
  absl::Time moved = absl::Now();
  uint64_t admitted_at = 0;  // the step every shard admitted the rank at; 0: none yet
  absl::Status last_refusal = absl::OkStatus();
  absl::Duration poll = kFirstPoll;
  // Bounded by the stall above; the count only guards against a clock that
  // does not move.
  for (int attempt = 0; attempt < 1000000; ++attempt) {
    if (attempt > 0) {
      absl::SleepFor(poll);
      poll = std::min(2 * poll, kLongestPoll);
    }
    ASSIGN_OR_RETURN(const std::vector<v1::GetStatusResponse> statuses, Statuses(client));
    uint64_t newest = 0;
    for (const v1::GetStatusResponse& status : statuses) {
      newest = std::max<uint64_t>(newest, status.newest_step());
    }
    if (newest > newest_seen || attempt == 0) {
      newest_seen = newest;
      moved = absl::Now();
    } else if (absl::Now() - moved > stall) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, " waited ", absl::FormatDuration(stall), " to rejoin the job and its "
          "newest step stayed ", newest, last_refusal.ok() ? "" : ": ",
          last_refusal.message()));
    }
    if (admitted_at != 0) {
      bool averaged = true;
      bool dropped_again = false;
      for (const v1::GetStatusResponse& status : statuses) {
        averaged = averaged && status.newest_full_average_step() >= admitted_at;
        dropped_again = dropped_again || !IsMember(status, rank);
      }
      if (dropped_again) {
        // A shard that admitted it timed out a later round before every
        // shard had: start over.
        spdlog::warn("{}rank {} was dropped again before the average of step {}; rejoining "
                     "later", log_prefix, rank, admitted_at);
        admitted_at = 0;
      } else if (averaged) {
        return admitted_at;
      }
      continue;
    }
    const uint64_t step = (newest + 2 + every - 1) / every * every;
    if (step >= total_steps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " cannot rejoin: the job ends at step ", total_steps,
          " before its next admission step ", step, " (cluster.admit_every_steps ", every, ")"));
    }
    absl::Status refused = absl::OkStatus();
    for (uint32_t s = 0; s < client.layout().num_shards() && refused.ok(); ++s) {
      refused = client.Rejoin(s, step);
    }
    if (refused.ok()) {
      spdlog::info("{}rank {} admitted back from the full average of step {}", log_prefix, rank,
                   step);
      admitted_at = step;
      poll = kFirstPoll;
    } else if (absl::IsFailedPrecondition(refused) || absl::IsUnavailable(refused)) {
      last_refusal = refused;
    } else {
      return refused;
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("rank ", rank, " gave up rejoining the job after too many attempts"));
}

}  // namespace cserps
