// LocalGroup for local ranks that are threads of one process: the CPU
// implementation, for tests of the hierarchical logic and for GPU-less nodes
// that run several workers in one process.
#ifndef CSERPS_WORKER_GROUP_THREAD_GROUP_H_
#define CSERPS_WORKER_GROUP_THREAD_GROUP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/group/local_group.h"

namespace cserps {

struct ThreadGroupOptions {
  // How long a member waits in a collective for the others to join before
  // the collective fails (DEADLINE_EXCEEDED naming the missing local ranks).
  absl::Duration timeout = absl::Minutes(5);
};

// One member of a group of threads. The members exchange data through each
// other's buffers: a collective copies nothing until every member has
// joined, and each member then does 1/size of the work.
//
// AllReduceSum adds in local-rank order, ((d_0 + d_1) + d_2) + ..., in
// float32, so the result is the same bits whichever member arrives first.
class ThreadGroup final : public LocalGroup {
 public:
  // The `size` members (>= 1) of one new group, indexed by local rank. Each
  // is used by one thread at a time (any thread); the members may be
  // destroyed in any order (they share the group's state), but not while
  // another member is inside a collective that waits for it.
  static std::vector<std::unique_ptr<ThreadGroup>> Create(
      uint32_t size, ThreadGroupOptions options = {});

  uint32_t local_rank() const override { return local_rank_; }
  uint32_t size() const override;

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Broadcast(uint32_t root, absl::Span<float> data) override;

 private:
  class Shared;
  ThreadGroup(std::shared_ptr<Shared> shared, uint32_t local_rank);

  const std::shared_ptr<Shared> shared_;
  const uint32_t local_rank_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_THREAD_GROUP_H_
