// The payloads of one shard's recent rounds, by (stream, step, ratio): every
// push of a GRBS round, and its completion, need the same selection, and
// drawing it costs O(blocks) (common/grbs.h), which at small block sizes
// was most of a round's server time. Thread-safe.
#ifndef CSERPS_SERVER_PAYLOAD_CACHE_H_
#define CSERPS_SERVER_PAYLOAD_CACHE_H_

#include <cstdint>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/block_layout.h"

namespace cserps {

class PayloadCache {
 public:
  PayloadCache(uint64_t seed, const BlockLayout& layout, uint32_t shard);

  // The shard's floats of round (stream, step, ratio), in payload order.
  std::shared_ptr<const ShardPayload> Get(int stream, uint64_t step, uint32_t ratio);

 private:
  // Rounds of a few steps and both streams in flight at once.
  static constexpr size_t kEntries = 16;
  struct Entry {
    int stream = 0;
    uint64_t step = 0;
    uint32_t ratio = 0;
    std::shared_ptr<const ShardPayload> payload;
  };

  const uint64_t seed_;
  const BlockLayout& layout_;
  const uint32_t shard_;
  const std::shared_ptr<const ShardPayload> all_blocks_;
  absl::Mutex mu_;
  std::deque<Entry> recent_ ABSL_GUARDED_BY(mu_);  // newest first
};

}  // namespace cserps

#endif  // CSERPS_SERVER_PAYLOAD_CACHE_H_
