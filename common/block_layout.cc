#include "common/block_layout.h"

#include <algorithm>
#include <cstring>

#include "common/status.h"

namespace cserps {

BlockLayout::BlockLayout(uint64_t num_params, uint32_t block_size,
                         uint32_t num_shards)
    : num_params_(num_params), block_size_(block_size), num_shards_(num_shards) {
  CSERPS_CHECK(block_size > 0 && num_shards > 0);
  num_blocks_ = (num_params + block_size - 1) / block_size;
  blocks_per_shard_ = (num_blocks_ + num_shards - 1) / num_shards;
}

uint64_t BlockLayout::BlockBegin(uint64_t block) const {
  return std::min(num_params_, block * block_size_);
}

uint64_t BlockLayout::BlockEnd(uint64_t block) const {
  return std::min(num_params_, (block + 1) * block_size_);
}

uint64_t BlockLayout::ShardFirstBlock(uint32_t shard) const {
  return std::min(num_blocks_, shard * blocks_per_shard_);
}

uint64_t BlockLayout::ShardEndBlock(uint32_t shard) const {
  return std::min(num_blocks_, (shard + 1) * blocks_per_shard_);
}

uint64_t BlockLayout::ShardFirstFloat(uint32_t shard) const {
  return BlockBegin(ShardFirstBlock(shard));
}

uint64_t BlockLayout::ShardEndFloat(uint32_t shard) const {
  return BlockBegin(ShardEndBlock(shard));
}

void ShardPayload::Append(uint64_t model_offset, uint64_t length) {
  if (length == 0) return;
  if (!segments_.empty()) {
    Segment& last = segments_.back();
    if (last.model_offset + last.length == model_offset) {
      last.length += length;
      size_ += length;
      return;
    }
  }
  segments_.push_back(Segment{model_offset, size_, length});
  size_ += length;
}

ShardPayload ShardPayload::AllBlocks(const BlockLayout& layout,
                                     uint32_t shard) {
  ShardPayload p;
  p.Append(layout.ShardFirstFloat(shard), layout.ShardSize(shard));
  return p;
}

ShardPayload ShardPayload::SelectedBlocks(
    const BlockLayout& layout, uint32_t shard,
    absl::Span<const uint64_t> sorted_blocks) {
  ShardPayload p;
  const uint64_t first = layout.ShardFirstBlock(shard);
  const uint64_t end = layout.ShardEndBlock(shard);
  auto it = std::lower_bound(sorted_blocks.begin(), sorted_blocks.end(), first);
  for (; it != sorted_blocks.end() && *it < end; ++it) {
    p.Append(layout.BlockBegin(*it), layout.BlockEnd(*it) - layout.BlockBegin(*it));
  }
  return p;
}

void ShardPayload::Gather(absl::Span<const float> model, uint64_t begin,
                          absl::Span<float> out) const {
  ForEachPiece(begin, out.size(), [&](uint64_t m, uint64_t p, uint64_t n) {
    std::memcpy(out.data() + (p - begin), model.data() + m, n * sizeof(float));
  });
}

void ShardPayload::Scatter(absl::Span<const float> in, uint64_t begin,
                           absl::Span<float> model) const {
  ForEachPiece(begin, in.size(), [&](uint64_t m, uint64_t p, uint64_t n) {
    std::memcpy(model.data() + m, in.data() + (p - begin), n * sizeof(float));
  });
}

uint64_t ChunkFloats(uint32_t max_message_bytes) {
  CSERPS_CHECK(max_message_bytes > 2 * kMessageOverheadBytes);
  return (max_message_bytes - kMessageOverheadBytes) / sizeof(float);
}

uint64_t ChunkFloats(const v1::ClusterConfig& cluster) {
  const uint32_t chunk = cluster.chunk_bytes() != 0 ? cluster.chunk_bytes() : kDefaultChunkBytes;
  return std::min<uint64_t>(chunk / sizeof(float), ChunkFloats(cluster.max_message_bytes()));
}

uint32_t NumChunks(uint64_t payload_floats, uint64_t chunk_floats) {
  return static_cast<uint32_t>((payload_floats + chunk_floats - 1) / chunk_floats);
}

}  // namespace cserps
