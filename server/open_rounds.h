// What the dense and sparse round tables (round_table.h,
// sparse_round_table.h) share about failing their open rounds: a map from a
// round's key to a round with `pushed` (by rank), `waiters` and
// `first_push`. The failures are taken under the table's lock and answered
// after it is released, so that no callback runs with the lock held.
#ifndef CSERPS_SERVER_OPEN_ROUNDS_H_
#define CSERPS_SERVER_OPEN_ROUNDS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace cserps {

// Failed rounds with the callers still to answer.
template <typename Callback>
class FailedRounds {
 public:
  void Add(absl::Status status, std::vector<Callback> waiters) {
    failed_.emplace_back(std::move(status), std::move(waiters));
  }
  int size() const { return static_cast<int>(failed_.size()); }
  // Answers every waiter with its round's status; call without the lock.
  void Answer() {
    for (auto& [status, waiters] : failed_) {
      for (Callback& w : waiters) w(status);
    }
  }

 private:
  std::vector<std::pair<absl::Status, std::vector<Callback>>> failed_;
};

// Erases every round of `open` whose first push is `timeout` or more before
// `now`, adding it to `failed` with DEADLINE_EXCEEDED "<name(key)> timed
// out after <timeout>s: missing ranks <r, ...> of world_size <n>", and
// returns the erased keys.
template <typename Map, typename Name, typename Callback>
std::vector<typename Map::key_type> TakeOverdue(Map& open, absl::Time now,
                                                absl::Duration timeout, uint32_t world_size,
                                                const Name& name,
                                                FailedRounds<Callback>* failed) {
  std::vector<typename Map::key_type> taken;
  for (auto it = open.begin(); it != open.end();) {
    auto& round = it->second;
    if (now < round.first_push + timeout) {
      ++it;
      continue;
    }
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < world_size; ++r) {
      if (!round.pushed[r]) missing.push_back(r);
    }
    failed->Add(absl::DeadlineExceededError(absl::StrCat(
                    name(it->first), " timed out after ", absl::ToDoubleSeconds(timeout),
                    "s: missing ranks ", absl::StrJoin(missing, ", "), " of world_size ",
                    world_size)),
                std::move(round.waiters));
    taken.push_back(it->first);
    it = open.erase(it);
  }
  return taken;
}

// Empties `open` into `failed`, each round with UNAVAILABLE "<name(key)>
// failed: <reason>", and returns the keys.
template <typename Map, typename Name, typename Callback>
std::vector<typename Map::key_type> TakeAll(Map& open, const std::string& reason,
                                            const Name& name,
                                            FailedRounds<Callback>* failed) {
  std::vector<typename Map::key_type> taken;
  for (auto& [key, round] : open) {
    failed->Add(absl::UnavailableError(absl::StrCat(name(key), " failed: ", reason)),
                std::move(round.waiters));
    taken.push_back(key);
  }
  open.clear();
  return taken;
}

// When the oldest round of `open` becomes overdue; InfiniteFuture when none.
template <typename Map>
absl::Time EarliestDeadline(const Map& open, absl::Duration timeout) {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [key, round] : open) {
    earliest = std::min(earliest, round.first_push + timeout);
  }
  return earliest;
}

}  // namespace cserps

#endif  // CSERPS_SERVER_OPEN_ROUNDS_H_
