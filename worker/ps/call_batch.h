// What the PS client's calls share: a batch of RPCs waited for together,
// with the first error kept, the deadline every call gets, and the backoff
// between attempts of the calls that lost their connection or outlived
// their attempt's deadline.
#ifndef CSERPS_WORKER_PS_CALL_BATCH_H_
#define CSERPS_WORKER_PS_CALL_BATCH_H_

#include <grpcpp/client_context.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// A failure another attempt may cure: the connection went (reset, refused,
// a server restarting at its address). The calls the client retries are
// idempotent on the servers: a push is counted once per round and rank
// (an asynchronous one applied once per rank, offset and step), Register
// keeps a worker id's rank, PushModel writes the same floats.
inline bool Retryable(const absl::Status& status) { return absl::IsUnavailable(status); }

// One attempt's deadline: `limit` from now, never past the call's. The
// servers answer a synchronous round's call within round_timeout_s of its
// arrival (a round not complete by then fails), so a round's attempt is
// limited to a little more: one still open then is stuck in its connection
// (gRPC has been seen to hold a stream cut by a reset mid-message until the
// call's deadline) and is sent again while the call's deadline allows.
inline absl::Time AttemptDeadline(absl::Time deadline, absl::Duration limit) {
  return std::min(deadline, absl::Now() + limit);
}

// Retryable, or the attempt's own deadline, before the call's, ended it
// (give or take 10 ms: gRPC keeps its deadlines in milliseconds).
inline bool RetryableAttempt(const absl::Status& status, absl::Time attempt_deadline,
                             absl::Time deadline) {
  return Retryable(status) ||
         (absl::IsDeadlineExceeded(status) && attempt_deadline < deadline &&
          absl::Now() >= attempt_deadline - absl::Milliseconds(10));
}

// Capped exponential backoff between attempts: 20 ms, doubling, at most
// 1 s between two, as many as the deadline allows (so at most about one a
// second): a call whose connection is reset again and again still has the
// time its deadline gives it, which a count of retries would cut short.
class Backoff {
 public:
  explicit Backoff(absl::Time deadline) : deadline_(deadline) {}

  // Sleeps before the next attempt; false, at once, when none is left.
  bool Wait() {
    if (absl::Now() + delay_ >= deadline_) return false;
    absl::SleepFor(delay_);
    delay_ = std::min(2 * delay_, absl::Seconds(1));
    ++retries_;
    return true;
  }
  int retries() const { return retries_; }
  // `last`, the status of the last attempt Wait allowed, saying so.
  absl::Status Exhausted(const absl::Status& last) const {
    return absl::Status(last.code(), absl::StrCat(last.message(), " (after ", retries_ + 1,
                                                  " attempts)"));
  }

 private:
  const absl::Time deadline_;
  absl::Duration delay_ = absl::Milliseconds(20);
  int retries_ = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_CALL_BATCH_H_
