// The table of open averaging rounds of one server shard.
//
// A round is keyed by (step, stream, chunk). Every member of the job pushes
// its values for the round once; when the last member has pushed, the table
// computes the weighted mean  sum_i w_i v_i / sum_i w_i  (accumulated in
// double), calls Options::on_complete once (the shard applies the mean to its
// model there), and then answers every waiting caller with the same mean.
//
// Thread safety: every method may be called from any thread. Callbacks
// (`RoundCallback`, `on_complete`, `on_latency`) are never called with the
// table's lock held; a callback may run inline in Push (round already
// complete, or this push completed it, or the push was refused) or later on
// the thread of the push that completes the round, or of ExpireOverdue /
// FailAll.
#ifndef CSERPS_SERVER_ROUND_TABLE_H_
#define CSERPS_SERVER_ROUND_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/buffer_pool.h"
#include "server/round_lifecycle.h"

namespace cserps {

// "GRAD" for a cserps.v1.Stream value, its number for any other.
std::string StreamName(int stream);

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
using RoundMean = std::shared_ptr<const MeanValues>;
using RoundCallback = std::function<void(absl::StatusOr<RoundMean>)>;

// What a dense round collects: sum_i w_i v_i per element and sum_i w_i, in
// double, and the learning rate of its first push. The first push writes
// the sum (0 + w_0 v_0), so the buffer is never zeroed first; or, when its
// values are kept alive for the round (Contribution::keep), it is not read
// at all until the second, which writes 0 + w_0 v_0 + w_1 v_1 in one pass,
// or, being the last, the mean: the same double operations in the same
// order, so the same bits, with one pass over the floats fewer (a round of
// two members writes no sum at all). The Aggregate of RoundLifecycle
// (round_lifecycle.h, which lists what each member is for).
class WeightedSum {
 public:
  using Key = RoundKey;
  struct Contribution {
    float weight = 1.0f;
    float lr = 0.0f;
    // Read during Add only, unless `keep` is set: then they stay valid, and
    // unchanged, while the round holds `keep`.
    absl::Span<const float> values;
    std::shared_ptr<const void> keep;
  };
  using Shape = size_t;  // values per push
  using Result = RoundMean;
  static constexpr absl::string_view kKind = "";
  static constexpr int kFullAverageStream = 3;  // cserps.v1.CHECKPOINT

  WeightedSum(const Contribution& first, uint32_t world_size);
  // Each member once; the last of world_size computes the mean.
  void Add(uint32_t rank, const Contribution& push);
  // sum_i w_i v_i / sum_i w_i, rounded to float once, over the members
  // added: all of them, or those an elastic round completed with.
  RoundMean Mean() const;
  float lr() const { return lr_; }

  static uint64_t Step(const RoundKey& key) { return key.step; }
  static int Stream(const RoundKey& key) { return key.stream; }
  // "round (step 12, stream GRAD, chunk 0)", with ", ratio r" when r > 1.
  static std::string RoundName(const RoundKey& key);
  static std::string PushName(const RoundKey& key, uint32_t rank);
  static std::string StepName(const RoundKey& key);
  static Shape ShapeOf(const Contribution& push) { return push.values.size(); }
  // INVALID_ARGUMENT when the weight is not finite and > 0.
  static absl::Status Check(const RoundKey& key, uint32_t rank, const Contribution& push);
  static absl::Status CheckShape(const RoundKey& key, uint32_t rank, Shape got, Shape want);

 private:
  size_t size_ = 0;
  uint32_t world_size_ = 1;
  uint32_t added_ = 0;
  // size_ values, written by the first Add (the second when the first is
  // held); none when world_size_ is 1 or only one push was added.
  std::shared_ptr<UninitialisedVector<double>> sum_;
  // The first push, not yet read, while it is the only one (and kept).
  Contribution held_;
  double weight_total_ = 0.0;
  RoundMean mean_;  // written by the last Add
  float lr_ = 0.0f;
};

extern template class RoundLifecycle<WeightedSum>;

// Open, completing and retained rounds, the step window, timeouts and
// shutdown are RoundLifecycle's (round_lifecycle.h): ExpireOverdue,
// NextDeadline, FailAll and the counters come from there.
class RoundTable : public RoundLifecycle<WeightedSum> {
 public:
  struct Options {
    RoundLimits limits;
    // Called exactly once per completed round, before any waiter is
    // answered, without the table's lock held. The rounds of one stream
    // complete in step order in the synchronous algorithms, but the table
    // does not rely on it.
    // `lr` is the learning rate of the round's first push.
    std::function<void(const RoundKey&, float lr, absl::Span<const float> mean)>
        on_complete;
    // Optional: called once per completed round, after on_complete and
    // before any waiter is answered, with the time from the round's first
    // push to the push that completed it (the `now`s given to Push).
    std::function<void(const RoundKey&, absl::Duration)> on_latency;
  };

  explicit RoundTable(Options options);

  // Adds `rank`'s `values` with `weight` to round `key` at time `now`.
  // `done` is called exactly once with the mean, or with:
  //  INVALID_ARGUMENT  rank >= world_size; weight not finite or <= 0;
  //                    values.size() differs from the round's length (the
  //                    length of the first push of the round);
  //  OUT_OF_RANGE      step too far ahead / behind (message says which and
  //                    gives the allowed window);
  //  DEADLINE_EXCEEDED the round timed out (message names the missing ranks,
  //                    e.g. "round (step 12, stream GRAD, chunk 0) timed out
  //                    after 60s: missing ranks 2, 5 of world_size 6");
  //  UNAVAILABLE       FailAll was called (shutdown).
  // A retried push (same rank, same key) is never counted twice: while the
  // round is open the caller joins the waiters; once it is complete it is
  // answered from the retained mean. A retry with a different length is
  // INVALID_ARGUMENT like any other.
  // `lr` is kept with the round for on_complete (GRAD rounds apply
  // x -= lr * mean); every member sends the same one. `values` are read
  // while Push runs, or, when `keep` is set, while the round holds it (the
  // caller leaves them unchanged until `keep` is released). `count` is
  // called first, once (CountPush).
  void Push(const RoundKey& key, uint32_t rank, float weight, float lr,
            absl::Span<const float> values, absl::Time now, RoundCallback done,
            std::shared_ptr<const void> keep = nullptr, CountPush count = CountNoPush);

 private:
  RoundMean Finish(const RoundKey& key, const WeightedSum& sum,
                   absl::Duration latency) const;

  const std::function<void(const RoundKey&, float, absl::Span<const float>)>
      on_complete_;
  const std::function<void(const RoundKey&, absl::Duration)> on_latency_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ROUND_TABLE_H_
