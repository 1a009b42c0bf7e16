// What the PS client's calls share: a batch of RPCs waited for together,
// with the first error kept, and the deadline every call gets.
#ifndef CSERPS_WORKER_PS_CALL_BATCH_H_
#define CSERPS_WORKER_PS_CALL_BATCH_H_

#include <grpcpp/client_context.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cserps {

// Counts the RPCs of one operation and keeps the first error.
class CallBatch {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  void Done(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
    --outstanding_;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &outstanding_));
    return first_error_;
  }

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// Adds the time spent in `wait` to *waited (nanoseconds).
inline absl::Status TimedWait(CallBatch& batch, std::atomic<int64_t>* waited) {
  const absl::Time start = absl::Now();
  absl::Status status = batch.Wait();
  waited->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start));
  return status;
}

// `timeout` from now; the call waits for its channel to be ready.
inline void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(true);
}

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_CALL_BATCH_H_
