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

#ifdef NDEBUG
TEST(LockOrderChecksTest, DebiansAbseilChecksTheOrderOfEveryLock) {
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
TEST(LockOrderChecksTest, ABuildWithoutNdebugKeepsThem) {
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
