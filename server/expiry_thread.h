// A background thread that fails what is overdue: it calls expire(now())
// whenever next_deadline() has passed, and wakes at least every `max_wait`
// so that deadlines that appear while it sleeps are noticed. The services of
// a shard own one each (round timeouts, silent async workers).
#ifndef CSERPS_SERVER_EXPIRY_THREAD_H_
#define CSERPS_SERVER_EXPIRY_THREAD_H_

#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace cserps {

class ExpiryThread {
 public:
  ExpiryThread(std::function<absl::Time()> now,
               std::function<absl::Time()> next_deadline,
               std::function<void(absl::Time)> expire,
               absl::Duration max_wait = absl::Seconds(1));
  // Stops the thread and joins it; `expire` is not called afterwards.
  ~ExpiryThread();

  ExpiryThread(const ExpiryThread&) = delete;
  ExpiryThread& operator=(const ExpiryThread&) = delete;

 private:
  void Loop();

  const std::function<absl::Time()> now_;
  const std::function<absl::Time()> next_deadline_;
  const std::function<void(absl::Time)> expire_;
  const absl::Duration max_wait_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once everything above is built
};

// The expiry thread of a table of rounds (RoundTable, SparseRoundTable): it
// fails the rounds as they become overdue. `rounds` outlives the thread.
template <typename Rounds>
std::unique_ptr<ExpiryThread> StartRoundExpiry(std::function<absl::Time()> now,
                                               Rounds* rounds) {
  return std::make_unique<ExpiryThread>(
      std::move(now), [rounds] { return rounds->NextDeadline(); },
      [rounds](absl::Time t) { rounds->ExpireOverdue(t); });
}

}  // namespace cserps

#endif  // CSERPS_SERVER_EXPIRY_THREAD_H_
