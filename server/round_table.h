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
#include <utility>
#include <memory>
#include <string>
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
  // The block selection ratio: pushes of one step and stream at different
  // ratios cover different blocks and so are different rounds.
  uint32_t ratio = 1;

  friend bool operator<(const RoundKey& a, const RoundKey& b) {
    return std::tie(a.step, a.stream, a.ratio, a.chunk) <
           std::tie(b.step, b.stream, b.ratio, b.chunk);
  }
  friend bool operator==(const RoundKey& a, const RoundKey& b) {
    return a.step == b.step && a.stream == b.stream && a.ratio == b.ratio &&
           a.chunk == b.chunk;
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
    // `lr` is the learning rate of the round's first push.
    std::function<void(const RoundKey&, float lr, const std::vector<float>& mean)>
        on_complete;
  };

  explicit RoundTable(Options options);
  RoundTable(const RoundTable&) = delete;
  RoundTable& operator=(const RoundTable&) = delete;
  // Fails the rounds still open, so that no caller waits forever.
  ~RoundTable();

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
  // `lr` is kept with the round for on_complete (GRAD rounds apply
  // x -= lr * mean); every member sends the same one.
  void Push(const RoundKey& key, uint32_t rank, float weight, float lr,
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
  // The same, of the rounds of one stream (RoundKey::stream).
  uint64_t rounds_completed(int stream) const;
  uint64_t rounds_failed(int stream) const;
  // Newest step of any completed round; 0 before the first.
  uint64_t newest_step() const;

 private:
  // A round still collecting pushes.
  struct Round {
    std::vector<double> sum;     // sum of weight * value, per element
    double weight_total = 0.0;
    std::vector<bool> pushed;    // by rank, so a retry is not counted twice
    uint32_t ranks_pushed = 0;
    std::vector<RoundCallback> waiters;
    absl::Time first_push;
    float lr = 0.0f;
  };
  // A round whose last push has arrived but whose on_complete has not
  // returned yet. Retries join `waiters` here rather than being answered
  // early (before on_complete) or starting a new round.
  struct CompletingRound {
    size_t length = 0;
    std::vector<RoundCallback> waiters;
  };
  // Completed rounds of one stream kept to answer retries.
  struct StreamHistory {
    // step -> (ratio, chunk) -> mean
    std::map<uint64_t, std::map<std::pair<uint32_t, uint32_t>, RoundMean>> by_step;
    bool retired_any = false;
    uint64_t newest_retired = 0;  // meaningful only when retired_any
  };

  // The mean of `key` if it is completed and retained, else null.
  const RoundMean* FindRetainedLocked(const RoundKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when a new round may be opened for `key` (the step window).
  absl::Status CheckWindowLocked(const RoundKey& key, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `key` from completing_ to the retained store, retires the
  // stream's oldest steps beyond retained_rounds and returns the waiters.
  std::vector<RoundCallback> FinishLocked(const RoundKey& key,
                                          const RoundMean& mean)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::map<RoundKey, Round> open_ ABSL_GUARDED_BY(mu_);
  std::map<RoundKey, CompletingRound> completing_ ABSL_GUARDED_BY(mu_);
  std::map<int, StreamHistory> streams_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  uint64_t rounds_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, uint64_t> completed_by_stream_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> failed_by_stream_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_step_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_TABLE_H_
