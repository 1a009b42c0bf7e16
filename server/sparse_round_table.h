// The open sparse top-k rounds of one server shard: one round per step.
//
// Every member pushes its sparse vector for the step once; when the last
// member has pushed, Options::complete runs once (it aggregates, applies the
// result to the shard's model and encodes the reply), and then every waiting
// caller gets the same reply. Retries are never counted twice, completed
// rounds of the newest `retained_rounds` steps answer retries, a round open
// longer than `timeout` fails naming the missing ranks: the rules of
// RoundLifecycle (round_lifecycle.h), which the dense RoundTable follows too,
// keyed by step alone. The sparse rounds are all of one stream, 0.
//
// Thread safety: every method may be called from any thread. Callbacks are
// never called with the table's lock held; one may run inline in Push (the
// round was already complete, this push completed it, or it was refused) or
// later on the thread of the push that completes the round, or of
// ExpireOverdue / FailAll.
#ifndef CSERPS_SERVER_SPARSE_ROUND_TABLE_H_
#define CSERPS_SERVER_SPARSE_ROUND_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/round_lifecycle.h"
#include "server/sparse_aggregate.h"

namespace cserps {

using SparseRoundReply = std::shared_ptr<const SparseReply>;
using SparseRoundCallback = std::function<void(absl::StatusOr<SparseRoundReply>)>;

// What a sparse round collects: the members' pushes by rank, aggregated only
// once the round is complete. The Aggregate of RoundLifecycle
// (round_lifecycle.h, which lists what each member is for).
class SparsePushes {
 public:
  using Key = uint64_t;  // the step
  using Contribution = SparseVector;
  // Every push has the service's k_s entries, checked before the table.
  struct Shape {};
  using Result = SparseRoundReply;
  static constexpr absl::string_view kKind = "sparse ";
  static constexpr int kFullAverageStream = -1;  // none: not elastic

  SparsePushes(const SparseVector& first, uint32_t world_size);
  void Add(uint32_t rank, SparseVector push);
  // The pushes by rank, moved out.
  std::vector<SparseVector> Take() { return std::move(pushes_); }

  static uint64_t Step(uint64_t step) { return step; }
  static int Stream(uint64_t /*step*/) { return 0; }
  // "sparse round of step 12".
  static std::string RoundName(uint64_t step);
  static std::string PushName(uint64_t step, uint32_t rank);
  static std::string StepName(uint64_t step);
  static Shape ShapeOf(const SparseVector& /*push*/) { return {}; }
  static absl::Status Check(uint64_t /*step*/, uint32_t /*rank*/,
                            const SparseVector& /*push*/) {
    return absl::OkStatus();
  }
  static absl::Status CheckShape(uint64_t /*step*/, uint32_t /*rank*/, Shape /*got*/,
                                 Shape /*want*/) {
    return absl::OkStatus();
  }

 private:
  std::vector<SparseVector> pushes_;
};

extern template class RoundLifecycle<SparsePushes>;

class SparseRoundTable : public RoundLifecycle<SparsePushes> {
 public:
  struct Options {
    RoundLimits limits;
    // Called once per completed round with the members' pushes by rank,
    // without the lock, before any waiter is answered. Required.
    std::function<SparseReply(uint64_t step, std::vector<SparseVector> pushes)>
        complete;
    // Optional: called once per completed round, after `complete` and before
    // any waiter is answered, with the time from the round's first push to
    // the push that completed it (the `now`s given to Push).
    std::function<void(absl::Duration)> on_latency;
  };

  explicit SparseRoundTable(Options options);

  // Adds `rank`'s `entries` to the round of `step` at time `now`. `done` is
  // called exactly once with the reply, or with INVALID_ARGUMENT (rank out
  // of range), OUT_OF_RANGE (step window), DEADLINE_EXCEEDED (the round
  // timed out; names the missing ranks) or UNAVAILABLE (FailAll). A retry
  // (same rank and step) is not counted again: its entries are ignored and
  // it gets the round's reply. `count` is called first, once (CountPush).
  void Push(uint64_t step, uint32_t rank, SparseVector entries, absl::Time now,
            SparseRoundCallback done, CountPush count = CountNoPush);

 private:
  SparseRoundReply Finish(uint64_t step, SparsePushes pushes,
                          absl::Duration latency) const;

  const std::function<SparseReply(uint64_t, std::vector<SparseVector>)> complete_;
  const std::function<void(absl::Duration)> on_latency_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SPARSE_ROUND_TABLE_H_
