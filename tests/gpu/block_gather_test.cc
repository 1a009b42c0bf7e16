// Gather, scatter, scatter-axpy and fill of GRBS-selected blocks on the
// device against plain CPU loops, and the staging order against the CPU's
// ShardPayload, on random models and random block sets.
#include "worker/cuda/kernels/block_gather.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/block_layout.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace cserps {
namespace {

struct Case {
  uint64_t num_params;
  uint32_t block_size;
  std::vector<uint64_t> blocks;  // ascending
  std::string name;
};

uint64_t NumBlocks(uint64_t num_params, uint32_t block_size) {
  return (num_params + block_size - 1) / block_size;
}

// GRBS selections at several ratios and steps, the full set, and hand-made
// sets that hold the short last block.
std::vector<Case> Cases() {
  std::vector<Case> cases;
  const struct {
    uint64_t d;
    uint32_t block;
  } shapes[] = {{10007, 64}, {4096, 64}, {50, 64}, {1000003, 1000}, {12345, 1},
                {777, 7}};
  for (const auto& s : shapes) {
    const uint64_t b = NumBlocks(s.d, s.block);
    for (uint32_t ratio : {1u, 4u, 16u, 100u}) {
      for (uint64_t step = 0; step < 3; ++step) {
        cases.push_back({s.d, s.block, SelectBlocks(7, 0, step, ratio, b),
                         "d=" + std::to_string(s.d) + " block=" +
                             std::to_string(s.block) + " R=" + std::to_string(ratio) +
                             " step=" + std::to_string(step)});
      }
    }
    cases.push_back({s.d, s.block, {b - 1}, "last block only, d=" + std::to_string(s.d)});
    if (b > 1) {
      cases.push_back({s.d, s.block, {0, b - 1}, "first and last, d=" + std::to_string(s.d)});
    }
  }
  return cases;
}

std::vector<float> RandomVector(uint64_t key, size_t n) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
  return v;
}

// The model indices of the selected blocks in staging order.
std::vector<uint64_t> SelectedIndices(const Case& c) {
  std::vector<uint64_t> indices;
  for (uint64_t b : c.blocks) {
    const uint64_t end = std::min<uint64_t>((b + 1) * c.block_size, c.num_params);
    for (uint64_t j = b * c.block_size; j < end; ++j) indices.push_back(j);
  }
  return indices;
}

void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got,
                    const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
      << what;
}

TEST(BlockGatherTest, GatheredFloatsCountsTheShortLastBlock) {
  EXPECT_EQ(cuda::GatheredFloats(10, 4, {0, 1, 2}), 10u);  // 4 + 4 + 2
  EXPECT_EQ(cuda::GatheredFloats(10, 4, {2}), 2u);
  EXPECT_EQ(cuda::GatheredFloats(12, 4, {1, 2}), 8u);
  EXPECT_EQ(cuda::GatheredFloats(12, 4, {}), 0u);
  for (const Case& c : Cases()) {
    EXPECT_EQ(cuda::GatheredFloats(c.num_params, c.block_size, c.blocks),
              SelectedIndices(c).size())
        << c.name;
  }
}

TEST(BlockGatherTest, ZeroBlockSizeIsRejected) {
  EXPECT_EQ(cuda::LaunchGatherBlocks(nullptr, {10, 0, nullptr, 1}, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BlockGatherTest, MatchesCpuOnRandomBlockSets) {
  CSERPS_SKIP_WITHOUT_GPU();
  const float lr = 0.1f;
  uint64_t key = 0;
  for (const Case& c : Cases()) {
    const std::vector<uint64_t> indices = SelectedIndices(c);
    const std::vector<float> model = RandomVector(++key, c.num_params);
    const std::vector<float> incoming = RandomVector(++key, indices.size());
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint64_t> d_blocks, Upload(c.blocks));
    const cuda::BlockList list{c.num_params, c.block_size, d_blocks.data(), c.blocks.size()};

    // Gather.
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_model, Upload(model));
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_staging,
                                DeviceBuffer<float>::Allocate(indices.size()));
    CSERPS_ASSERT_OK(cuda::LaunchGatherBlocks(d_model.data(), list, d_staging.data(), nullptr));
    std::vector<float> want(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) want[k] = model[indices[k]];
    CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> got,
                                Download(d_staging.data(), indices.size()));
    ExpectSameBits(want, got, c.name + ": gather");

    // The CPU's payload order over a 3-shard layout: the shards' payloads,
    // concatenated, are the staging buffer.
    const BlockLayout layout(c.num_params, c.block_size, 3);
    std::vector<float> payloads;
    for (uint32_t s = 0; s < layout.num_shards(); ++s) {
      const ShardPayload payload = ShardPayload::SelectedBlocks(layout, s, c.blocks);
      std::vector<float> part(payload.size());
      payload.Gather(model, 0, absl::MakeSpan(part));
      payloads.insert(payloads.end(), part.begin(), part.end());
    }
    ExpectSameBits(payloads, got, c.name + ": gather vs ShardPayload");

    // Scatter (assign).
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_in, Upload(incoming));
    CSERPS_ASSERT_OK(cuda::LaunchScatterBlocks(d_in.data(), list, d_model.data(), nullptr));
    want = model;
    for (size_t k = 0; k < indices.size(); ++k) want[indices[k]] = incoming[k];
    CSERPS_ASSERT_OK_AND_ASSIGN(got, Download(d_model.data(), c.num_params));
    ExpectSameBits(want, got, c.name + ": scatter");

    // Scatter-axpy with alpha = -lr: the CPU's x -= lr * v.
    CSERPS_ASSERT_OK_AND_ASSIGN(d_model, Upload(model));
    CSERPS_ASSERT_OK(
        cuda::LaunchScatterAxpyBlocks(d_in.data(), -lr, list, d_model.data(), nullptr));
    want = model;
    for (size_t k = 0; k < indices.size(); ++k) want[indices[k]] -= lr * incoming[k];
    CSERPS_ASSERT_OK_AND_ASSIGN(got, Download(d_model.data(), c.num_params));
    ExpectSameBits(want, got, c.name + ": scatter-axpy");

    // Fill with zero (an error buffer's reset on the sent blocks).
    CSERPS_ASSERT_OK_AND_ASSIGN(d_model, Upload(model));
    CSERPS_ASSERT_OK(cuda::LaunchFillBlocks(0.0f, list, d_model.data(), nullptr));
    want = model;
    for (uint64_t j : indices) want[j] = 0.0f;
    CSERPS_ASSERT_OK_AND_ASSIGN(got, Download(d_model.data(), c.num_params));
    ExpectSameBits(want, got, c.name + ": fill");
  }
}

}  // namespace
}  // namespace cserps
