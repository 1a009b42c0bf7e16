// The table of open averaging rounds of one server shard.
//
// A round is keyed by (step, stream, chunk). Every member of the job pushes
// its values for the round once; when the last member has pushed, the table
// computes the weighted mean  sum_i w_i v_i / sum_i w_i  (accumulated in
// double), calls Options::on_complete once (the shard applies the mean to its
// model there), and then answers every waiting caller with the same mean.
//
// Thread safety: every method may be called from any thread. Callbacks
// (`RoundCallback`, `on_complete`) are never called with the table's lock
// held; a callback may run inline in Push (round already complete, or this
// push completed it, or the push was refused) or later on the thread of the
// push that completes the round, or of ExpireOverdue / FailAll.
#ifndef CSERPS_SERVER_ROUND_TABLE_H_
#define CSERPS_SERVER_ROUND_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cserps {

struct RoundKey {
  uint64_t step = 0;
  int stream = 0;  // a cserps.v1.Stream value
  uint32_t chunk = 0;

  friend bool operator<(const RoundKey& a, const RoundKey& b) {
    return std::tie(a.step, a.stream, a.chunk) <
           std::tie(b.step, b.stream, b.chunk);
  }
  friend bool operator==(const RoundKey& a, const RoundKey& b) {
    return a.step == b.step && a.stream == b.stream && a.chunk == b.chunk;
  }
};

// The mean of a completed round; shared by every answer.
using RoundMean = std::shared_ptr<const std::vector<float>>;
using RoundCallback = std::function<void(absl::StatusOr<RoundMean>)>;

class RoundTable {
 public:
  struct Options {
    uint32_t world_size = 1;
    // A push whose step is more than this ahead of the newest completed step
    // (over all streams) is refused with OUT_OF_RANGE.
    uint64_t max_step_lag = 8;
    // Completed rounds kept per stream, newest first, to answer retries;
    // older ones are retired. Pushes for a retired or older step are refused
    // with OUT_OF_RANGE ("too far behind").
    uint32_t retained_rounds = 4;
    // A round still open this long after its first push fails.
    absl::Duration timeout = absl::Seconds(60);
    // Called exactly once per completed round, before any waiter is
    // answered, without the table's lock held. The rounds of one stream
    // complete in step order in the synchronous algorithms, but the table
    // does not rely on it.
    std::function<void(const RoundKey&, const std::vector<float>& mean)>
        on_complete;
  };

  explicit RoundTable(Options options);
  RoundTable(const RoundTable&) = delete;
  RoundTable& operator=(const RoundTable&) = delete;

  // Adds `rank`'s `values` with `weight` to round `key` at time `now`.
  // `done` is called exactly once with the mean, or with:
  //  INVALID_ARGUMENT  rank >= world_size; weight not finite or <= 0;
  //                    values.size() differs from the round's length (the
  //                    length of the first push of the round);
  //  OUT_OF_RANGE      step too far ahead / behind (message says which and
  //                    gives the allowed window);
  //  DEADLINE_EXCEEDED the round timed out (message names the missing ranks);
  //  UNAVAILABLE       FailAll was called (shutdown).
  // A retried push (same rank, same key) is never counted twice: while the
  // round is open the caller joins the waiters; once it is complete it is
  // answered from the retained mean. A retry with a different length is
  // INVALID_ARGUMENT like any other.
  void Push(const RoundKey& key, uint32_t rank, float weight,
            absl::Span<const float> values, absl::Time now,
            RoundCallback done);

  // Fails every round whose first push is older than the timeout at `now`
  // with DEADLINE_EXCEEDED naming the ranks that did not push, e.g.
  // "round (step 12, stream 1, chunk 0) timed out after 60s: missing ranks 2, 5".
  // Returns the number of rounds failed. A failed round is forgotten: later
  // pushes for its key start a new round.
  int ExpireOverdue(absl::Time now);

  // Earliest time at which some open round will be overdue, or
  // absl::InfiniteFuture() when none is open.
  absl::Time NextDeadline() const;

  // Fails every open round with UNAVAILABLE `reason` (server shutdown) and
  // refuses later pushes the same way.
  void FailAll(const std::string& reason);

  size_t open_rounds() const;
  uint64_t rounds_completed() const;
  uint64_t rounds_failed() const;
  // Newest step of any completed round; 0 before the first.
  uint64_t newest_step() const;

 private:
  struct Round;
  // ... implementation-defined; every field guarded by mu_.
  Options options_;
  mutable absl::Mutex mu_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_TABLE_H_
