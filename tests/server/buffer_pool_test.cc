// BufferPool hands a buffer let go out again, newest first, for any size up
// to its capacity, keeps no more free bytes than its limit, and stays
// consistent when many threads take and let go of buffers at once.
#include "server/buffer_pool.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(BufferPoolTest, ABufferLetGoIsHandedOutAgainNewestFirst) {
  FloatPool pool(1 << 20);
  std::shared_ptr<MeanValues> a = pool.Get(1000);
  std::shared_ptr<MeanValues> b = pool.Get(1000);
  ASSERT_EQ(a->size(), 1000u);
  float* const a_data = a->data();
  float* const b_data = b->data();
  a.reset();
  b.reset();
  // Capacities are powers of two.
  EXPECT_EQ(pool.free_bytes(), 2 * 1024 * sizeof(float));
  EXPECT_EQ(pool.Get(1000)->data(), b_data);  // let go again at once
  std::shared_ptr<MeanValues> newest = pool.Get(1000);
  EXPECT_EQ(newest->data(), b_data);
  EXPECT_EQ(pool.Get(1000)->data(), a_data);
  EXPECT_EQ(pool.free_bytes(), 1024 * sizeof(float));
}

TEST(BufferPoolTest, ABufferServesEverySizeUpToItsCapacity) {
  FloatPool pool(1 << 20);
  float* const data = pool.Get(1000)->data();
  std::shared_ptr<MeanValues> smaller = pool.Get(513);
  EXPECT_EQ(smaller->data(), data);
  EXPECT_EQ(smaller->size(), 513u);
  smaller.reset();
  std::shared_ptr<MeanValues> full = pool.Get(1024);
  EXPECT_EQ(full->data(), data);
  EXPECT_EQ(full->size(), 1024u);
  // Past the capacity, or below half of it, another buffer.
  std::shared_ptr<MeanValues> larger = pool.Get(1025);
  EXPECT_NE(larger->data(), data);
  full.reset();
  std::shared_ptr<MeanValues> half = pool.Get(512);
  EXPECT_NE(half->data(), data);
  EXPECT_EQ(pool.free_bytes(), 1024 * sizeof(float));
}

TEST(BufferPoolTest, DoublesArePooledAlike) {
  BufferPool<double> pool(1 << 20);
  double* const data = pool.Get(300)->data();
  std::shared_ptr<UninitialisedVector<double>> again = pool.Get(257);
  EXPECT_EQ(again->data(), data);
  EXPECT_EQ(again->size(), 257u);
  again.reset();
  EXPECT_EQ(pool.free_bytes(), 512 * sizeof(double));
}

TEST(BufferPoolTest, KeepsNoMoreFreeBytesThanItsLimit) {
  FloatPool pool(3 * 128 * sizeof(float));
  std::vector<std::shared_ptr<MeanValues>> held;
  for (int i = 0; i < 5; ++i) held.push_back(pool.Get(100));
  held.clear();
  EXPECT_EQ(pool.free_bytes(), 3 * 128 * sizeof(float));
  // A buffer larger than what is left of the limit is freed, not kept.
  pool.Get(200).reset();
  EXPECT_EQ(pool.free_bytes(), 3 * 128 * sizeof(float));
}

TEST(BufferPoolTest, ManyThreadsTakeAndLetGoAtOnce) {
  FloatPool pool(1 << 20);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, &wrong, t] {
      for (int r = 0; r < kRounds; ++r) {
        const size_t n = 64 << (r % 3);
        std::shared_ptr<MeanValues> buffer = pool.Get(n);
        // Each holder owns its buffer alone while it holds it.
        for (size_t i = 0; i < n; ++i) (*buffer)[i] = static_cast<float>(t * kRounds + r);
        for (size_t i = 0; i < n; ++i) {
          if ((*buffer)[i] != static_cast<float>(t * kRounds + r)) ++wrong[t];
        }
        if (buffer->size() != n) ++wrong[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
  // Every buffer came back: at most one per thread and size was live at once.
  EXPECT_LE(pool.free_bytes(), kThreads * (64 + 128 + 256) * sizeof(float));
  EXPECT_GT(pool.free_bytes(), 0u);
}

}  // namespace
}  // namespace cserps
