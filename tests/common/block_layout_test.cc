#include "common/block_layout.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cserps/v1/parameter_server.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::ElementsAreArray;

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

using SegTuple = std::tuple<uint64_t, uint64_t, uint64_t>;
// (model_offset, payload_offset, length)
SegTuple Seg(uint64_t model_offset, uint64_t payload_offset, uint64_t length) {
  return SegTuple(model_offset, payload_offset, length);
}

// The global float indices a shard's payload covers, in payload order, built
// float by float from the rule "selected blocks the shard owns, ascending".
// Owner of a block: block / ceil(B/S).
std::vector<uint64_t> ReferenceIndices(uint64_t d, uint32_t block_size,
                                       uint32_t num_shards, uint32_t shard,
                                       const std::vector<uint64_t>& blocks) {
  const uint64_t num_blocks = CeilDiv(d, block_size);
  const uint64_t per_shard = CeilDiv(num_blocks, num_shards);
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < d; ++i) {
    const uint64_t block = i / block_size;
    if (block / per_shard != shard) continue;
    if (!std::binary_search(blocks.begin(), blocks.end(), block)) continue;
    out.push_back(i);
  }
  return out;
}

std::vector<uint64_t> AllBlockIds(uint64_t num_blocks) {
  std::vector<uint64_t> ids(num_blocks);
  for (uint64_t b = 0; b < num_blocks; ++b) ids[b] = b;
  return ids;
}

// Segments as maximal runs of consecutive model indices.
std::vector<SegTuple> ReferenceSegments(
    const std::vector<uint64_t>& indices) {
  std::vector<SegTuple> out;
  for (uint64_t p = 0; p < indices.size(); ++p) {
    if (!out.empty()) {
      auto& [m, po, n] = out.back();
      if (m + n == indices[p]) {
        ++n;
        continue;
      }
    }
    out.emplace_back(indices[p], p, 1);
  }
  return out;
}

std::vector<SegTuple> AsTuples(
    const ShardPayload& payload) {
  std::vector<SegTuple> out;
  for (const Segment& s : payload.segments()) {
    out.emplace_back(s.model_offset, s.payload_offset, s.length);
  }
  return out;
}

struct LayoutCase {
  uint64_t d;
  uint32_t block_size;
  uint32_t num_shards;
};

const LayoutCase kCases[] = {
    {40, 4, 2},       // even split, no short block
    {50, 4, 3},       // last block short (2 floats), uneven shards
    {1, 1024, 1},     // a model smaller than one block
    {10, 4, 5},       // S > B: 3 blocks over 5 shards, shards 2..4 empty
    {7850, 1024, 3},  // SOFTMAX 784->10
    {33010, 1024, 2},
    {1000, 7, 9},
    {0, 4, 2},        // empty model
};

TEST(BlockLayoutTest, RangesMatchTheFormula) {
  for (const LayoutCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << "d=" << c.d << " block_size="
                                    << c.block_size << " S=" << c.num_shards);
    const BlockLayout layout(c.d, c.block_size, c.num_shards);
    const uint64_t num_blocks = CeilDiv(c.d, c.block_size);
    const uint64_t per_shard = CeilDiv(num_blocks, c.num_shards);
    EXPECT_EQ(layout.num_params(), c.d);
    EXPECT_EQ(layout.block_size(), c.block_size);
    EXPECT_EQ(layout.num_blocks(), num_blocks);
    EXPECT_EQ(layout.num_shards(), c.num_shards);

    for (uint64_t b = 0; b < num_blocks; ++b) {
      EXPECT_EQ(layout.BlockBegin(b), b * c.block_size) << "block " << b;
      const uint64_t full_end = (b + 1) * c.block_size;
      EXPECT_EQ(layout.BlockEnd(b), full_end < c.d ? full_end : c.d)
          << "block " << b;
    }
    for (uint32_t s = 0; s < c.num_shards; ++s) {
      const uint64_t first = std::min<uint64_t>(num_blocks, s * per_shard);
      const uint64_t end = std::min<uint64_t>(num_blocks, (s + 1) * per_shard);
      EXPECT_EQ(layout.ShardFirstBlock(s), first) << "shard " << s;
      EXPECT_EQ(layout.ShardEndBlock(s), end) << "shard " << s;

      // Floats of the shard, found one by one from the owner of each float.
      uint64_t lo = c.d, hi = 0, count = 0;
      for (uint64_t i = 0; i < c.d; ++i) {
        if ((i / c.block_size) / per_shard != s) continue;
        lo = std::min(lo, i);
        hi = std::max(hi, i + 1);
        ++count;
      }
      EXPECT_EQ(layout.ShardSize(s), count) << "shard " << s;
      if (count > 0) {
        EXPECT_EQ(layout.ShardFirstFloat(s), lo) << "shard " << s;
        EXPECT_EQ(layout.ShardEndFloat(s), hi) << "shard " << s;
        EXPECT_EQ(hi - lo, count) << "shard " << s << " is not contiguous";
      } else {
        EXPECT_EQ(layout.ShardFirstFloat(s), layout.ShardEndFloat(s));
      }
    }
  }
}

TEST(BlockLayoutTest, ShardsTileTheModelInOrder) {
  for (const LayoutCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << "d=" << c.d << " block_size="
                                    << c.block_size << " S=" << c.num_shards);
    const BlockLayout layout(c.d, c.block_size, c.num_shards);
    uint64_t next_float = 0, next_block = 0;
    for (uint32_t s = 0; s < c.num_shards; ++s) {
      EXPECT_EQ(layout.ShardFirstFloat(s), next_float) << "shard " << s;
      EXPECT_EQ(layout.ShardFirstBlock(s), next_block) << "shard " << s;
      next_float = layout.ShardEndFloat(s);
      next_block = layout.ShardEndBlock(s);
    }
    EXPECT_EQ(next_float, c.d);
    EXPECT_EQ(next_block, layout.num_blocks());
  }
}

TEST(BlockLayoutTest, MoreShardsThanBlocksLeavesTrailingShardsEmpty) {
  // 3 blocks (4, 4, 2 floats) over 5 shards: one block each for shards 0..2.
  const BlockLayout layout(10, 4, 5);
  EXPECT_EQ(layout.num_blocks(), 3u);
  EXPECT_EQ(layout.ShardSize(0), 4u);
  EXPECT_EQ(layout.ShardSize(1), 4u);
  EXPECT_EQ(layout.ShardSize(2), 2u);
  EXPECT_EQ(layout.ShardFirstFloat(2), 8u);
  EXPECT_EQ(layout.ShardEndFloat(2), 10u);
  for (uint32_t s = 3; s < 5; ++s) {
    EXPECT_EQ(layout.ShardSize(s), 0u) << "shard " << s;
    EXPECT_EQ(layout.ShardFirstBlock(s), layout.ShardEndBlock(s));
    EXPECT_TRUE(ShardPayload::AllBlocks(layout, s).segments().empty());
    EXPECT_EQ(ShardPayload::AllBlocks(layout, s).size(), 0u);
  }
}

TEST(ShardPayloadTest, AllBlocksIsOneSegmentOverTheShard) {
  for (const LayoutCase& c : kCases) {
    SCOPED_TRACE(testing::Message() << "d=" << c.d << " block_size="
                                    << c.block_size << " S=" << c.num_shards);
    const BlockLayout layout(c.d, c.block_size, c.num_shards);
    const std::vector<uint64_t> all = AllBlockIds(layout.num_blocks());
    for (uint32_t s = 0; s < c.num_shards; ++s) {
      const ShardPayload p = ShardPayload::AllBlocks(layout, s);
      const std::vector<uint64_t> ref =
          ReferenceIndices(c.d, c.block_size, c.num_shards, s, all);
      EXPECT_EQ(p.size(), ref.size()) << "shard " << s;
      EXPECT_THAT(AsTuples(p), ElementsAreArray(ReferenceSegments(ref)))
          << "shard " << s;
      EXPECT_LE(p.segments().size(), 1u) << "shard " << s;
    }
  }
}

TEST(ShardPayloadTest, SelectedBlocksMergesAdjacentBlocks) {
  // d=50, block 4: 13 blocks, the last 2 floats; S=3: 5 blocks per shard.
  const BlockLayout layout(50, 4, 3);
  const std::vector<uint64_t> selected = {1, 2, 4, 6, 7, 9, 12};

  const ShardPayload p0 = ShardPayload::SelectedBlocks(layout, 0, selected);
  // Blocks 1,2 merge into floats [4,12); block 4 is [16,20).
  EXPECT_THAT(AsTuples(p0), ElementsAreArray({Seg(4, 0, 8),
                                              Seg(16, 8, 4)}));
  EXPECT_EQ(p0.size(), 12u);

  const ShardPayload p1 = ShardPayload::SelectedBlocks(layout, 1, selected);
  EXPECT_THAT(AsTuples(p1), ElementsAreArray({Seg(24, 0, 8),
                                              Seg(36, 8, 4)}));
  EXPECT_EQ(p1.size(), 12u);

  // The short last block.
  const ShardPayload p2 = ShardPayload::SelectedBlocks(layout, 2, selected);
  EXPECT_THAT(AsTuples(p2), ElementsAreArray({Seg(48, 0, 2)}));
  EXPECT_EQ(p2.size(), 2u);

  // Blocks 4 and 5 are adjacent in the model but on different shards.
  const std::vector<uint64_t> across = {4, 5};
  EXPECT_THAT(AsTuples(ShardPayload::SelectedBlocks(layout, 0, across)),
              ElementsAreArray({Seg(16, 0, 4)}));
  EXPECT_THAT(AsTuples(ShardPayload::SelectedBlocks(layout, 1, across)),
              ElementsAreArray({Seg(20, 0, 4)}));

  // A selection with nothing on the shard.
  EXPECT_EQ(ShardPayload::SelectedBlocks(layout, 2, across).size(), 0u);
  EXPECT_TRUE(ShardPayload::SelectedBlocks(layout, 2, across).segments().empty());
}

// A random ascending, distinct selection of about `fraction` of the blocks.
std::vector<uint64_t> RandomSelection(uint64_t num_blocks, double fraction,
                                      std::mt19937_64& rng) {
  std::bernoulli_distribution pick(fraction);
  std::vector<uint64_t> out;
  for (uint64_t b = 0; b < num_blocks; ++b) {
    if (pick(rng)) out.push_back(b);
  }
  return out;
}

TEST(ShardPayloadTest, RandomSelectionsMatchReference) {
  std::mt19937_64 rng(1234);
  for (const LayoutCase& c : kCases) {
    const BlockLayout layout(c.d, c.block_size, c.num_shards);
    for (double fraction : {0.1, 0.5, 0.9}) {
      const std::vector<uint64_t> sel =
          RandomSelection(layout.num_blocks(), fraction, rng);
      for (uint32_t s = 0; s < c.num_shards; ++s) {
        SCOPED_TRACE(testing::Message()
                     << "d=" << c.d << " block_size=" << c.block_size
                     << " S=" << c.num_shards << " shard=" << s
                     << " fraction=" << fraction);
        const ShardPayload p = ShardPayload::SelectedBlocks(layout, s, sel);
        const std::vector<uint64_t> ref =
            ReferenceIndices(c.d, c.block_size, c.num_shards, s, sel);
        EXPECT_EQ(p.size(), ref.size());
        EXPECT_THAT(AsTuples(p), ElementsAreArray(ReferenceSegments(ref)));
      }
    }
  }
}

TEST(ShardPayloadTest, GatherScatterRoundTripOnRandomData) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> value(-10.0f, 10.0f);
  const uint64_t d = 1000;
  const BlockLayout layout(d, 7, 9);
  for (int trial = 0; trial < 5; ++trial) {
    const std::vector<uint64_t> sel =
        RandomSelection(layout.num_blocks(), 0.4, rng);
    std::vector<float> model(d);
    for (float& x : model) x = value(rng);
    for (uint32_t s = 0; s < layout.num_shards(); ++s) {
      SCOPED_TRACE(testing::Message() << "trial " << trial << " shard " << s);
      const ShardPayload p = ShardPayload::SelectedBlocks(layout, s, sel);
      const std::vector<uint64_t> ref = ReferenceIndices(d, 7, 9, s, sel);
      ASSERT_EQ(p.size(), ref.size());

      // Whole payload.
      std::vector<float> gathered(p.size());
      p.Gather(model, 0, absl::MakeSpan(gathered));
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_EQ(gathered[i], model[ref[i]]) << "payload float " << i;
      }

      // Sub-ranges starting and ending inside segments.
      std::uniform_int_distribution<uint64_t> pos(0, p.size());
      for (int r = 0; r < 10 && p.size() > 0; ++r) {
        uint64_t a = pos(rng), b = pos(rng);
        if (a > b) std::swap(a, b);
        std::vector<float> part(b - a);
        p.Gather(model, a, absl::MakeSpan(part));
        for (uint64_t i = a; i < b; ++i) {
          ASSERT_EQ(part[i - a], model[ref[i]]) << "range [" << a << "," << b
                                                << ") float " << i;
        }
      }

      // Scatter into a zero model touches exactly the payload's floats.
      std::vector<float> fresh(p.size());
      for (float& x : fresh) x = value(rng);
      std::vector<float> target(d, 0.0f);
      p.Scatter(fresh, 0, absl::MakeSpan(target));
      std::vector<float> expected(d, 0.0f);
      for (size_t i = 0; i < ref.size(); ++i) expected[ref[i]] = fresh[i];
      ASSERT_THAT(target, ElementsAreArray(expected));

      // And gathering back gives what was scattered, also piecewise.
      std::vector<float> back(p.size());
      const uint64_t mid = p.size() / 3;
      p.Gather(target, 0, absl::MakeSpan(back).subspan(0, mid));
      p.Gather(target, mid, absl::MakeSpan(back).subspan(mid));
      ASSERT_THAT(back, ElementsAreArray(fresh));
    }
  }
}

TEST(ShardPayloadTest, ScatterOfARangeLeavesTheRestAlone) {
  const BlockLayout layout(50, 4, 3);
  const std::vector<uint64_t> sel = {1, 2, 4};
  const ShardPayload p = ShardPayload::SelectedBlocks(layout, 0, sel);
  // Payload floats [6, 10) are model floats 10, 11 (block 2) and 16, 17.
  std::vector<float> model(50, -1.0f);
  const std::vector<float> in = {1.0f, 2.0f, 3.0f, 4.0f};
  p.Scatter(in, 6, absl::MakeSpan(model));
  std::vector<float> expected(50, -1.0f);
  expected[10] = 1.0f;
  expected[11] = 2.0f;
  expected[16] = 3.0f;
  expected[17] = 4.0f;
  EXPECT_THAT(model, ElementsAreArray(expected));
}

struct Piece {
  uint64_t model_offset, payload_offset, length;
  friend bool operator==(const Piece& a, const Piece& b) {
    return a.model_offset == b.model_offset &&
           a.payload_offset == b.payload_offset && a.length == b.length;
  }
  friend std::ostream& operator<<(std::ostream& os, const Piece& p) {
    return os << "{" << p.model_offset << ", " << p.payload_offset << ", "
              << p.length << "}";
  }
};

std::vector<Piece> Pieces(const ShardPayload& p, uint64_t begin,
                          uint64_t count) {
  std::vector<Piece> out;
  p.ForEachPiece(begin, count, [&](uint64_t m, uint64_t po, uint64_t n) {
    out.push_back(Piece{m, po, n});
  });
  return out;
}

TEST(ShardPayloadTest, ForEachPieceCutsSegments) {
  // Segments {4,0,8} and {16,8,4} (see SelectedBlocksMergesAdjacentBlocks).
  const BlockLayout layout(50, 4, 3);
  const ShardPayload p = ShardPayload::SelectedBlocks(layout, 0, {1, 2, 4});
  ASSERT_EQ(p.segments().size(), 2u);

  EXPECT_THAT(Pieces(p, 0, 12),
              ElementsAreArray({Piece{4, 0, 8}, Piece{16, 8, 4}}));
  // Starts inside the first segment and ends inside the second.
  EXPECT_THAT(Pieces(p, 3, 7),
              ElementsAreArray({Piece{7, 3, 5}, Piece{16, 8, 2}}));
  // Inside one segment.
  EXPECT_THAT(Pieces(p, 2, 3), ElementsAreArray({Piece{6, 2, 3}}));
  EXPECT_THAT(Pieces(p, 9, 3), ElementsAreArray({Piece{17, 9, 3}}));
  // Exactly the segment boundary.
  EXPECT_THAT(Pieces(p, 8, 1), ElementsAreArray({Piece{16, 8, 1}}));
  EXPECT_THAT(Pieces(p, 7, 1), ElementsAreArray({Piece{11, 7, 1}}));
}

// Fails until the zero-length-piece bug of ShardPayload::ForEachPiece is
// fixed: for an empty range that starts inside a segment, lo == hi and fn is
// still called with length 0 (block_layout.h, ForEachPiece).
TEST(ShardPayloadTest, ForEachPieceOfAnEmptyRangeCallsNothing) {
  const BlockLayout layout(50, 4, 3);
  const ShardPayload p = ShardPayload::SelectedBlocks(layout, 0, {1, 2, 4});
  EXPECT_THAT(Pieces(p, 5, 0), ElementsAreArray(std::vector<Piece>{}));
  EXPECT_THAT(Pieces(p, 0, 0), ElementsAreArray(std::vector<Piece>{}));
  EXPECT_THAT(Pieces(p, 12, 0), ElementsAreArray(std::vector<Piece>{}));
}

TEST(ShardPayloadTest, ForEachPieceCoversRandomRangesExactly) {
  std::mt19937_64 rng(7);
  const BlockLayout layout(33010, 1024, 2);
  const std::vector<uint64_t> sel =
      RandomSelection(layout.num_blocks(), 0.5, rng);
  for (uint32_t s = 0; s < 2; ++s) {
    const ShardPayload p = ShardPayload::SelectedBlocks(layout, s, sel);
    const std::vector<uint64_t> ref = ReferenceIndices(33010, 1024, 2, s, sel);
    ASSERT_EQ(p.size(), ref.size());
    std::uniform_int_distribution<uint64_t> pos(0, p.size());
    for (int r = 0; r < 50; ++r) {
      uint64_t a = pos(rng), b = pos(rng);
      if (a > b) std::swap(a, b);
      SCOPED_TRACE(testing::Message() << "shard " << s << " range [" << a
                                      << "," << b << ")");
      uint64_t next = a;
      for (const Piece& piece : Pieces(p, a, b - a)) {
        ASSERT_EQ(piece.payload_offset, next) << "gap or overlap";
        ASSERT_GT(piece.length, 0u);
        for (uint64_t i = 0; i < piece.length; ++i) {
          ASSERT_EQ(piece.model_offset + i, ref[piece.payload_offset + i]);
        }
        next += piece.length;
      }
      ASSERT_EQ(next, b);
    }
  }
}

TEST(ChunkTest, NumChunksIsCeilingDivision) {
  EXPECT_EQ(NumChunks(0, 100), 0u);
  EXPECT_EQ(NumChunks(1, 100), 1u);
  EXPECT_EQ(NumChunks(99, 100), 1u);
  EXPECT_EQ(NumChunks(100, 100), 1u);
  EXPECT_EQ(NumChunks(101, 100), 2u);
  EXPECT_EQ(NumChunks(300, 100), 3u);
  EXPECT_EQ(NumChunks(301, 100), 4u);
  for (uint64_t payload = 0; payload < 500; payload += 37) {
    for (uint64_t chunk : {1u, 16u, 128u, 1000u}) {
      const uint32_t n = NumChunks(payload, chunk);
      // n chunks cover the payload, n - 1 do not.
      EXPECT_GE(n * chunk, payload) << payload << "/" << chunk;
      if (n > 0) {
        EXPECT_LT((n - 1) * chunk, payload) << payload << "/" << chunk;
      }
    }
  }
}

TEST(ChunkTest, AFullChunkRequestFitsTheMessageLimit) {
  for (uint32_t max_bytes : {64u * 1024, 100000u, 4u * 1024 * 1024}) {
    SCOPED_TRACE(max_bytes);
    const uint64_t floats = ChunkFloats(max_bytes);
    // A PushPullRequest with every scalar field at its widest varint.
    v1::PushPullRequest request;
    request.set_fingerprint(~uint64_t{0});
    request.set_rank(~uint32_t{0});
    request.set_step(~uint64_t{0});
    request.set_stream(v1::MODEL);
    request.set_ratio(~uint32_t{0});
    request.set_chunk(~uint32_t{0});
    request.set_weight(1.0f);
    request.set_lr(1.0f);
    request.set_values(std::string(floats * sizeof(float), '\0'));
    EXPECT_LE(request.ByteSizeLong(), max_bytes);
    // And the allowance is not wasteful: most of the message is floats.
    EXPECT_GE(floats * sizeof(float) + 4096, max_bytes);
    EXPECT_LE(ChunkFloats(max_bytes), ChunkFloats(max_bytes + 4));
  }
}

TEST(ChunkTest, AJobsChunksAreItsChunkBytesWithinTheMessageLimit) {
  v1::ClusterConfig cluster;
  cluster.set_max_message_bytes(4u << 20);
  // Unset: 1 MiB, a quarter of a 4 MiB message's room.
  EXPECT_EQ(ChunkFloats(cluster), 262144u);
  cluster.set_chunk_bytes(256u << 10);
  EXPECT_EQ(ChunkFloats(cluster), 65536u);
  // A limit smaller than the default chunk: the limit's, as before chunks
  // had a size of their own.
  cluster.clear_chunk_bytes();
  cluster.set_max_message_bytes(64 * 1024);
  EXPECT_EQ(ChunkFloats(cluster), ChunkFloats(64u * 1024));
  EXPECT_EQ(ChunkFloats(cluster), 16128u);
}

}  // namespace
}  // namespace cserps
