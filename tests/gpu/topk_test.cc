// Device top-k against SelectTopK (worker/device/topk_select.h) on random data full
// of ties, signed zeros, infinities and NaNs: the same positions, and the
// values at them bit for bit.
#include "worker/cuda/kernels/topk.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/device/topk_select.h"

namespace cserps {
namespace {

// Magnitudes from a set of 7, both signs: most entries tie with many others.
// About 1% each of NaN (either sign), +-infinity and -0.
std::vector<float> TiedValues(uint64_t key, size_t n) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) {
    const uint64_t r = rng.Below(100);
    if (r == 0) {
      x = rng.Below(2) ? std::numeric_limits<float>::quiet_NaN()
                       : -std::numeric_limits<float>::quiet_NaN();
    } else if (r == 1) {
      x = rng.Below(2) ? INFINITY : -INFINITY;
    } else if (r == 2) {
      x = -0.0f;
    } else {
      const float magnitude = 0.5f * static_cast<float>(rng.Below(7));
      x = rng.Below(2) ? magnitude : -magnitude;
    }
  }
  return v;
}

std::vector<float> DistinctValues(uint64_t key, size_t n) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = 2.0f * rng.UniformFloat() - 1.0f;
  return v;
}

void ExpectMatchesCpu(const std::vector<float>& values, uint64_t k,
                      const std::string& what) {
  std::vector<uint32_t> want;
  SelectTopK(values, k, &want);

  CSERPS_ASSERT_OK_AND_ASSIGN(const size_t bytes, cuda::TopKWorkspaceBytes(values.size(), k));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_values, Upload(values));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<char> workspace, DeviceBuffer<char>::Allocate(bytes));
  const size_t kept = want.size();
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint32_t> d_positions,
                              DeviceBuffer<uint32_t>::Allocate(kept));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_selected,
                              DeviceBuffer<float>::Allocate(kept));
  CSERPS_ASSERT_OK(cuda::LaunchTopK(d_values.data(), values.size(), k, workspace.data(),
                                    bytes, d_positions.data(), d_selected.data(), nullptr));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> positions,
                              Download(d_positions.data(), kept));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> selected,
                              Download(d_selected.data(), kept));
  ASSERT_EQ(positions, want) << what;
  for (size_t i = 0; i < kept; ++i) {
    EXPECT_EQ(std::memcmp(&selected[i], &values[want[i]], sizeof(float)), 0)
        << what << ": value at position " << want[i];
  }
}

TEST(TopKTest, TooManyValuesForThirtyTwoBitPositions) {
  const absl::StatusOr<size_t> bytes = cuda::TopKWorkspaceBytes(uint64_t{1} << 32, 5);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TopKTest, MatchesCpuWithTies) {
  CSERPS_SKIP_WITHOUT_GPU();
  uint64_t key = 0;
  for (size_t n : {1u, 2u, 100u, 4097u, 100000u}) {
    const std::vector<float> values = TiedValues(++key, n);
    for (uint64_t k : {uint64_t{1}, uint64_t{n / 3}, uint64_t{n / 2}, uint64_t{n - 1},
                       uint64_t{n}, uint64_t{n + 5}}) {
      if (k == 0) continue;
      ExpectMatchesCpu(values, k, "ties n=" + std::to_string(n) + " k=" + std::to_string(k));
    }
  }
}

TEST(TopKTest, MatchesCpuOnDistinctValues) {
  CSERPS_SKIP_WITHOUT_GPU();
  const std::vector<float> values = DistinctValues(99, 1 << 20);
  for (uint64_t k : {uint64_t{1}, uint64_t{1000}, uint64_t{1 << 18}}) {
    ExpectMatchesCpu(values, k, "distinct k=" + std::to_string(k));
  }
}

TEST(TopKTest, ZeroKWritesNothing) {
  CSERPS_SKIP_WITHOUT_GPU();
  const std::vector<float> values = DistinctValues(5, 64);
  CSERPS_ASSERT_OK_AND_ASSIGN(const size_t bytes, cuda::TopKWorkspaceBytes(values.size(), 0));
  EXPECT_EQ(bytes, 0u);
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_values, Upload(values));
  const std::vector<uint32_t> sentinel = {12345};
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint32_t> d_positions, Upload(sentinel));
  CSERPS_ASSERT_OK(cuda::LaunchTopK(d_values.data(), values.size(), 0, nullptr, 0,
                                    d_positions.data(), nullptr, nullptr));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> positions,
                              Download(d_positions.data(), 1));
  EXPECT_EQ(positions, sentinel);
}

}  // namespace
}  // namespace cserps
