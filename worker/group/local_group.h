// The processes (one per GPU) of one node as a group with collective
// operations: the intra-node half of hierarchical averaging
// (worker/ps/staged_average.h, docs/protocol.md "Intra-node groups").
// ThreadGroup (worker/group/thread_group.h) implements it for ranks that are
// threads of one process; NcclGroup (worker/cuda/nccl_group.h) for one
// process per GPU.
#ifndef CSERPS_WORKER_GROUP_LOCAL_GROUP_H_
#define CSERPS_WORKER_GROUP_LOCAL_GROUP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace cserps {

// One member's handle on the group: local rank local_rank() of size().
//
// Collectives: every member calls the same collectives in the same order,
// with buffers of the same length (and the same root); each call returns
// when the operation is complete for this member. Buffers are host memory,
// owned by the caller, and need only live for the call (an implementation
// over device collectives stages them through its own device memory).
//
// Errors: a collective that some member does not join within the
// implementation's timeout fails with DEADLINE_EXCEEDED naming the local
// ranks that did not join, where the implementation can know them; members
// that disagree about the collective (kind, length or root) get
// FAILED_PRECONDITION naming both. After either, the group is broken: every
// later collective on every member fails at once with ABORTED quoting the
// first failure. Bad arguments (a root not below size()) are
// INVALID_ARGUMENT, before joining.
//
// Thread safety: one thread at a time per member; different members may be
// used from different threads or processes.
class LocalGroup {
 public:
  virtual ~LocalGroup() = default;

  virtual uint32_t local_rank() const = 0;
  virtual uint32_t size() const = 0;

  // data <- the element-wise float32 sum of every member's data. Every
  // member receives bit-identical results (the sum is taken in one fixed
  // order, whatever the arrival order).
  virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;

  // data <- the data of local rank `root`, bit for bit (the root's buffer is
  // left as it is).
  virtual absl::Status Broadcast(uint32_t root, absl::Span<float> data) = 0;
};

// Every local rank's status, exchanged (a collective: every member calls it
// at the same point): OK when all are OK; otherwise this rank's own error,
// or one with the code of the first local rank that failed, naming it and
// `what` (its own error, logged there, says why). So that no member waits in
// a later collective for a peer that has given up.
absl::Status ShareStatus(LocalGroup& group, const absl::Status& mine,
                         absl::string_view what);

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_LOCAL_GROUP_H_
