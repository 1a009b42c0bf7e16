// One average round whose payloads the caller gathers itself, sent and
// received shard by shard (the staged average, staged_average.h): shard s's
// request can go out while shard s+1's payload is still being copied.
// Given the same values it is the same round as PsClient::AverageBlocks
// (stream, step, ratio, values, weight, lr, ...) and gives bit-identical
// means.
//
// Threads: one at a time. Destroying a round waits for every started
// shard's reply (the buffers given to StartShard must outlive that).
#ifndef CSERPS_WORKER_PS_SHARDED_AVERAGE_H_
#define CSERPS_WORKER_PS_SHARDED_AVERAGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace cserps {

class ShardedAverage {
 public:
  virtual ~ShardedAverage() = default;
  // The shards the round sends to, ascending: those of the client's shards
  // whose payload is not empty.
  virtual const std::vector<uint32_t>& shards() const = 0;
  // Floats of `shard`'s payload: its GRBS-selected blocks, ascending,
  // concatenated (ShardPayload); 0 for a shard not in shards().
  virtual uint64_t payload_size(uint32_t shard) const = 0;
  // Sends `payload` to `shard`. `payload` and `mean` (as many floats) must
  // stay alive, and the payload unchanged where it is not the mean's, until
  // WaitShard(shard) returns, which writes the weighted mean into `mean`
  // (it may be the payload's buffer) and sends again, from the payload, the
  // chunks whose connection broke before their reply. INVALID_ARGUMENT
  // naming the shard and the sizes when `payload` or `mean` is not
  // payload_size(shard) floats; FAILED_PRECONDITION for a shard not in
  // shards() or already started.
  virtual absl::Status StartShard(uint32_t shard, absl::Span<const float> payload,
                                  absl::Span<float> mean) = 0;
  // Blocks until `shard`'s reply is in its `mean`. FAILED_PRECONDITION when
  // the shard was not started or was already awaited; DATA_LOSS for a reply
  // of the wrong size; the RPC's error naming the shard and its address.
  virtual absl::Status WaitShard(uint32_t shard) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_SHARDED_AVERAGE_H_
