#include "server/expiry_thread.h"

#include <algorithm>
#include <utility>

namespace cserps {

ExpiryThread::ExpiryThread(std::function<absl::Time()> now,
                           std::function<absl::Time()> next_deadline,
                           std::function<void(absl::Time)> expire,
                           absl::Duration max_wait)
    : now_(std::move(now)),
      next_deadline_(std::move(next_deadline)),
      expire_(std::move(expire)),
      max_wait_(max_wait),
      thread_([this] { Loop(); }) {}

ExpiryThread::~ExpiryThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void ExpiryThread::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Duration wait = std::clamp(next_deadline_() - now_(),
                                           absl::Milliseconds(10), max_wait_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
    if (stopping_) break;
    mu_.Unlock();  // expire() answers callers: never under this lock
    expire_(now_());
    mu_.Lock();
  }
}

}  // namespace cserps
