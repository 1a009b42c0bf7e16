// A process that loads cuBLAS can still serve metrics (no device needed).
// cuBLASLt's static thread-local storage (about 92 KiB) did not fit the
// fixed 100 KiB thread stacks of prometheus-cpp's web server, so every
// metrics endpoint of a CUDA-linked worker failed to start.
#include <cublas_v2.h>
#include <library_types.h>

#include <memory>
#include <string>

#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

TEST(MetricsWithCublasTest, EndpointStartsAndServesWithCublasLoaded) {
  // A call into cuBLAS keeps the library (and cuBLASLt behind it) linked.
  int major = 0;
  ASSERT_EQ(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_GT(major, 0);

  auto metrics = MetricsRegistry::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  auto counter = (*metrics)->Counter("cserps_test_total", "A test counter.", {});
  ASSERT_TRUE(counter.ok()) << counter.status();
  (*counter)->Increment(3);
  EXPECT_THAT((*metrics)->Collect(), ::testing::HasSubstr("cserps_test_total 3"));
}

}  // namespace
}  // namespace cserps
