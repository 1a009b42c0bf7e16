// What a training algorithm asks of the servers (ALGORITHMS.md, "The
// server's view"): averaging rounds of GRBS-selected blocks, the sparse
// top-k exchange, and asynchronous SGD's apply-and-read. PsClient
// (ps_client.h) implements it over gRPC; a benchmark may wrap it (to delay
// the replies, say).
//
// In a node of several local ranks, each local rank's communicator reaches
// only its own shards (ps_client.h, PsClientOptions), and the node's
// average is staged_average.h's.
#ifndef CSERPS_WORKER_PS_COMMUNICATOR_H_
#define CSERPS_WORKER_PS_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "common/sparse_vector.h"
#include "cserps/v1/parameter_server.pb.h"
#include "worker/ps/sharded_average.h"

namespace cserps {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // The job's blocks and shards.
  virtual const BlockLayout& layout() const = 0;

  // One averaging round of `weight`·values on the blocks GRBS(stream, step,
  // ratio) (ratio 1: every block), shard by shard (sharded_average.h);
  // `lr` is what the servers apply on GRAD rounds. Sends nothing yet.
  virtual std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream,
                                                              uint64_t step,
                                                              uint32_t ratio,
                                                              float weight,
                                                              float lr) = 0;

  // The sparse top-k exchange of gtopk-ssgd and topk-ssgd for `step`
  // (docs/protocol.md 14). `local` holds, for every non-empty shard s,
  // exactly k_s = ShardSparseK(...) entries inside s. Blocks until every
  // shard has answered; then `*result` holds the entries the servers
  // selected (ascending) with their sums over the members, and the servers
  // have applied x -= sum / P there.
  virtual absl::Status ExchangeSparse(uint64_t step, const SparseVector& local,
                                      SparseVector* result) = 0;

  // Asynchronous SGD: pushes the model-sized gradient `grad` of this
  // worker's step; the servers apply x <- x - lr * Direction(g) at once and
  // answer with their model, written into `model` (model-sized; may alias
  // `grad`). Waits while the servers hold this worker back
  // (algorithm.staleness).
  virtual absl::Status AsyncPushPull(uint64_t step, float lr,
                                     absl::Span<const float> grad,
                                     absl::Span<float> model) = 0;

  // Reads the whole model; with `wait_for_init`, waits until it was pushed.
  virtual absl::Status PullModel(absl::Span<float> model, bool wait_for_init) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_COMMUNICATOR_H_
