// The averaging primitive every algorithm is written against
// (ALGORITHMS.md, "Average"). PsClient implements it over gRPC; tests may
// implement it in-process.
#ifndef CSERPS_WORKER_COMMUNICATOR_H_
#define CSERPS_WORKER_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cserps/v1/parameter_server.pb.h"

namespace cserps {

// An average in flight; Wait() returns once every shard has answered.
class PendingAverage {
 public:
  virtual ~PendingAverage() = default;
  // Writes the mean into the `mean` buffer given to StartAverage. Call once.
  virtual absl::Status Wait() = 0;
};

// A sparse vector: strictly ascending global float indices, one value each.
struct SparseVector {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Starts averaging `values` (a full model-sized vector) with `weight` over
  // the blocks GRBS(stream, step, ratio) (ratio 1: every block); `lr` is
  // what the servers apply on GRAD rounds. `values` is read before this
  // returns and may then be reused. `mean` (model-sized) must stay alive
  // until Wait() returns; Wait writes the weighted mean of every member's
  // values into the selected floats of `mean` and leaves the others as they
  // are. `mean` may be the same buffer as `values`.
  virtual std::unique_ptr<PendingAverage> StartAverage(
      v1::Stream stream, uint64_t step, uint32_t ratio,
      absl::Span<const float> values, float weight, float lr,
      absl::Span<float> mean) = 0;

  absl::Status AverageBlocks(v1::Stream stream, uint64_t step, uint32_t ratio,
                             absl::Span<const float> values, float weight,
                             float lr, absl::Span<float> mean) {
    return StartAverage(stream, step, ratio, values, weight, lr, mean)->Wait();
  }

  // The sparse top-k exchange of gtopk-ssgd and topk-ssgd for `step`
  // (docs/protocol.md 14). `local` holds, for every non-empty shard s,
  // exactly k_s = ShardSparseK(...) entries inside s. Blocks until every
  // shard has answered; then `*result` holds the entries the servers
  // selected (ascending) with their sums over the members, and the servers
  // have applied x -= sum / P there. UNIMPLEMENTED where not supported.
  virtual absl::Status ExchangeSparse(uint64_t /*step*/, const SparseVector& /*local*/,
                                      SparseVector* /*result*/) {
    return absl::UnimplementedError("this communicator has no sparse exchange");
  }
};

}  // namespace cserps

#endif  // CSERPS_WORKER_COMMUNICATOR_H_
