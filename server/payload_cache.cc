#include "server/payload_cache.h"

#include <utility>

#include "common/grbs.h"

namespace cserps {

PayloadCache::PayloadCache(uint64_t seed, const BlockLayout& layout, uint32_t shard)
    : seed_(seed),
      layout_(layout),
      shard_(shard),
      all_blocks_(std::make_shared<const ShardPayload>(ShardPayload::AllBlocks(layout, shard))) {}

std::shared_ptr<const ShardPayload> PayloadCache::Get(int stream, uint64_t step,
                                                      uint32_t ratio) {
  if (ratio == 1) return all_blocks_;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : recent_) {
      if (e.stream == stream && e.step == step && e.ratio == ratio) return e.payload;
    }
  }
  // Drawn without the lock; two threads may both draw one, which is only
  // wasted work.
  auto payload = std::make_shared<const ShardPayload>(ShardPayload::SelectedBlocks(
      layout_, shard_, SelectBlocks(seed_, stream, step, ratio, layout_.num_blocks())));
  absl::MutexLock lock(&mu_);
  recent_.push_front({stream, step, ratio, payload});
  if (recent_.size() > kEntries) recent_.pop_back();
  return payload;
}

}  // namespace cserps
