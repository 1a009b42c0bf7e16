// How the flat model is cut into blocks and the blocks into server shards
// (docs/protocol.md, "Block layout"), and which floats of a shard one round
// carries and how that payload is cut into chunks.
#ifndef CSERPS_COMMON_BLOCK_LAYOUT_H_
#define CSERPS_COMMON_BLOCK_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// d floats in blocks of `block_size` (the last may be shorter); shard s of S
// owns blocks [s*ceil(B/S), min(B, (s+1)*ceil(B/S))). The last shards may be
// empty (S > B, or e.g. B = 9, S = 4: ceil(9/4) = 3 leaves shard 3 nothing);
// clients send nothing to an empty shard.
class BlockLayout {
 public:
  BlockLayout(uint64_t num_params, uint32_t block_size, uint32_t num_shards);

  uint64_t num_params() const { return num_params_; }
  uint32_t block_size() const { return block_size_; }
  uint64_t num_blocks() const { return num_blocks_; }
  uint32_t num_shards() const { return num_shards_; }

  uint64_t BlockBegin(uint64_t block) const;  // first float of `block`
  uint64_t BlockEnd(uint64_t block) const;    // one past its last float
  uint64_t ShardFirstBlock(uint32_t shard) const;
  uint64_t ShardEndBlock(uint32_t shard) const;
  uint64_t ShardFirstFloat(uint32_t shard) const;
  uint64_t ShardEndFloat(uint32_t shard) const;
  uint64_t ShardSize(uint32_t shard) const {
    return ShardEndFloat(shard) - ShardFirstFloat(shard);
  }

 private:
  uint64_t num_params_;
  uint32_t block_size_;
  uint64_t num_blocks_;
  uint32_t num_shards_;
  uint64_t blocks_per_shard_;
};

// A run of consecutive model floats inside a payload.
struct Segment {
  uint64_t model_offset = 0;    // global float index
  uint64_t payload_offset = 0;  // index inside the shard's payload
  uint64_t length = 0;
};

// The floats of one shard that a round covers, in payload order: the shard's
// selected blocks in ascending block order, concatenated. Adjacent blocks
// merge into one segment.
class ShardPayload {
 public:
  // Every block of the shard.
  static ShardPayload AllBlocks(const BlockLayout& layout, uint32_t shard);
  // The blocks of `sorted_blocks` (ascending, distinct, global ids) that the
  // shard owns.
  static ShardPayload SelectedBlocks(const BlockLayout& layout, uint32_t shard,
                                     absl::Span<const uint64_t> sorted_blocks);

  uint64_t size() const { return size_; }
  const std::vector<Segment>& segments() const { return segments_; }

  // Payload floats [begin, begin + out.size()) from `model` (the full model,
  // indexed by global offset) into `out`.
  void Gather(absl::Span<const float> model, uint64_t begin,
              absl::Span<float> out) const;
  // The inverse: `in` into payload floats [begin, begin + in.size()).
  void Scatter(absl::Span<const float> in, uint64_t begin,
               absl::Span<float> model) const;

  // Calls fn(model_offset, payload_offset, length) for every piece of the
  // payload range [begin, begin + count).
  template <typename Fn>
  void ForEachPiece(uint64_t begin, uint64_t count, Fn fn) const;

 private:
  void Append(uint64_t model_offset, uint64_t length);

  std::vector<Segment> segments_;
  uint64_t size_ = 0;
};

// The allowance for PushPullRequest's fields other than `values` (a few
// varints and the bytes tag) and gRPC framing, with generous room to spare.
inline constexpr uint32_t kMessageOverheadBytes = 1024;

// The most floats per chunk that keep a request or reply within
// `max_message_bytes` (4 bytes per float plus kMessageOverheadBytes for the
// message's other fields).
uint64_t ChunkFloats(uint32_t max_message_bytes);
// cluster.chunk_bytes when it is 0 (unset).
inline constexpr uint32_t kDefaultChunkBytes = 1024 * 1024;

// Floats per chunk of a job: cluster.chunk_bytes / 4 (kDefaultChunkBytes
// when unset), within the message limit's ChunkFloats.
uint64_t ChunkFloats(const v1::ClusterConfig& cluster);
// Chunks of a payload of `payload_floats`: ceil(payload / chunk), at least 1
// for a non-empty payload and 0 for an empty one.
uint32_t NumChunks(uint64_t payload_floats, uint64_t chunk_floats);

template <typename Fn>
void ShardPayload::ForEachPiece(uint64_t begin, uint64_t count, Fn fn) const {
  if (count == 0) return;
  const uint64_t end = begin + count;
  for (const Segment& s : segments_) {
    const uint64_t s_end = s.payload_offset + s.length;
    if (s_end <= begin) continue;
    if (s.payload_offset >= end) break;
    const uint64_t lo = s.payload_offset > begin ? s.payload_offset : begin;
    const uint64_t hi = s_end < end ? s_end : end;
    fn(s.model_offset + (lo - s.payload_offset), lo, hi - lo);
  }
}

}  // namespace cserps

#endif  // CSERPS_COMMON_BLOCK_LAYOUT_H_
