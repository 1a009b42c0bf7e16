#include "common/lock_order_checks.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

// Locks a then b, then b then a: an order abseil's checks report.
void LockInBothOrders() {
  absl::Mutex a;
  absl::Mutex b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

// Every test binary runs gRPC's threads (tests/testing/callback_queue_hold.cc),
// and with the checks on each of their locks takes abseil's deadlock graph
// lock: a child forked while one holds it waits on it forever. A threadsafe
// death test starts its child afresh instead of forking this process.
#ifdef NDEBUG
TEST(LockOrderChecksDeathTest, DebiansAbseilChecksTheOrderOfEveryLock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
        LockInBothOrders();
      },
      "Potential Mutex deadlock");
}

TEST(LockOrderChecksTest, ABuildWithNdebugSkipsThem) {
  SkipLockOrderChecksWithNdebug();
  LockInBothOrders();  // would abort with the checks on
}
#else
TEST(LockOrderChecksDeathTest, ABuildWithoutNdebugKeepsThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SkipLockOrderChecksWithNdebug();
        LockInBothOrders();
      },
      "Potential Mutex deadlock");
}
#endif

}  // namespace
}  // namespace cserps
