// Abseil checks the order in which every absl::Mutex is locked only where
// abseil itself was built without NDEBUG, as Debian's is: each Lock then
// updates one graph of the process's locks, under one global lock (here 47
// ns a lock against 18 without, and a point where every thread of a busy
// shard meets; gRPC's own locks are absl::Mutex too). Builds with NDEBUG
// (Release, RelWithDebInfo) turn the checks off at the top of main; Debug
// builds, the sanitizer builds of tools/test.sh among them, keep them.
#ifndef CSERPS_COMMON_LOCK_ORDER_CHECKS_H_
#define CSERPS_COMMON_LOCK_ORDER_CHECKS_H_

#include "absl/synchronization/mutex.h"

namespace cserps {

// Call first in main, before any Mutex is locked.
inline void SkipLockOrderChecksWithNdebug() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace cserps

#endif  // CSERPS_COMMON_LOCK_ORDER_CHECKS_H_
