#include "worker/group/thread_group.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "worker/group/collective_op.h"

namespace cserps {

// The rendezvous of the members. A collective has two phases: Join (publish
// the buffer, wait until every member has) and Leave (wait until every
// member has finished its share, so that no buffer is still being read or
// written when its owner returns). The last member to leave resets the
// state for the next collective; no member can join the next one before
// that, because it would have to leave this one first.
class ThreadGroup::Shared {
 public:
  Shared(uint32_t size, absl::Duration timeout)
      : size_(size), timeout_(timeout), buffers_(size, nullptr), present_(size, false) {}

  uint32_t size() const { return size_; }

  // The buffers of every member, by local rank, once all have joined.
  absl::StatusOr<std::vector<float*>> Join(uint32_t rank, const CollectiveOp& op, float* data) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) {
      return absl::AbortedError(absl::StrCat(
          Describe(op), " on local rank ", rank,
          ": the local group failed earlier: ", broken_.message()));
    }
    const std::string what = absl::StrCat(Describe(op), " (collective #", completed_,
                                          ") on local rank ", rank);
    if (joined_ == 0) {
      op_ = op;
      op_rank_ = rank;
    } else if (!(op == op_)) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          what, ": local rank ", op_rank_, " called ", Describe(op_), " instead"));
      return broken_;
    }
    buffers_[rank] = data;
    present_[rank] = true;
    ++joined_;
    const bool all = mu_.AwaitWithTimeout(
        absl::Condition(this, &Shared::AllJoinedOrBroken), timeout_);
    if (!broken_.ok()) return broken_;
    if (!all) {
      std::vector<uint32_t> missing;
      for (uint32_t r = 0; r < size_; ++r) {
        if (!present_[r]) missing.push_back(r);
      }
      broken_ = absl::DeadlineExceededError(absl::StrCat(
          what, ": local rank(s) ", absl::StrJoin(missing, ", "),
          " did not join within ", absl::FormatDuration(timeout_)));
      return broken_;
    }
    return buffers_;
  }

  void Leave() {
    absl::MutexLock lock(&mu_);
    if (++left_ == size_) {
      ++completed_;
      joined_ = 0;
      left_ = 0;
      std::fill(buffers_.begin(), buffers_.end(), nullptr);
      std::fill(present_.begin(), present_.end(), false);
      return;
    }
    mu_.Await(absl::Condition(this, &Shared::Released));
  }

 private:
  bool AllJoinedOrBroken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return joined_ == size_ || !broken_.ok();
  }
  // left_ returns to 0 only when the last member leaves: see the class
  // comment for why it cannot rise again before this member has woken.
  bool Released() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return left_ == 0; }

  const uint32_t size_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;  // collectives, for messages
  uint32_t joined_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t left_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float*> buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> present_ ABSL_GUARDED_BY(mu_);
  CollectiveOp op_ ABSL_GUARDED_BY(mu_);  // of the first member to join
  uint32_t op_rank_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::unique_ptr<ThreadGroup>> ThreadGroup::Create(
    uint32_t size, ThreadGroupOptions options) {
  CSERPS_CHECK(size >= 1);
  auto shared = std::make_shared<Shared>(size, options.timeout);
  std::vector<std::unique_ptr<ThreadGroup>> members;
  for (uint32_t r = 0; r < size; ++r) {
    members.push_back(std::unique_ptr<ThreadGroup>(new ThreadGroup(shared, r)));
  }
  return members;
}

ThreadGroup::ThreadGroup(std::shared_ptr<Shared> shared, uint32_t local_rank)
    : shared_(std::move(shared)), local_rank_(local_rank) {}

uint32_t ThreadGroup::size() const { return shared_->size(); }

absl::Status ThreadGroup::AllReduceSum(absl::Span<float> data) {
  const CollectiveOp op{CollectiveKind::kAllReduceSum, 0, data.size()};
  ASSIGN_OR_RETURN(const std::vector<float*> buffers,
                   shared_->Join(local_rank_, op, data.data()));
  // This member's slice of every buffer; the slices partition [0, n).
  const size_t n = data.size();
  const size_t members = buffers.size();
  const size_t begin = n * local_rank_ / members;
  const size_t end = n * (local_rank_ + 1) / members;
  if (end > begin) {
    std::vector<float> sum(buffers[0] + begin, buffers[0] + end);
    for (size_t m = 1; m < members; ++m) {
      const float* in = buffers[m] + begin;
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += in[i];
    }
    for (float* out : buffers) {
      std::memcpy(out + begin, sum.data(), sum.size() * sizeof(float));
    }
  }
  shared_->Leave();
  return absl::OkStatus();
}

absl::Status ThreadGroup::Broadcast(uint32_t root, absl::Span<float> data) {
  if (root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast on local rank ", local_rank_, ": root ", root,
        " is not a local rank of a group of ", size()));
  }
  const CollectiveOp op{CollectiveKind::kBroadcast, root, data.size()};
  ASSIGN_OR_RETURN(const std::vector<float*> buffers,
                   shared_->Join(local_rank_, op, data.data()));
  if (local_rank_ != root && !data.empty()) {
    std::memcpy(data.data(), buffers[root], data.size() * sizeof(float));
  }
  shared_->Leave();
  return absl::OkStatus();
}

}  // namespace cserps
