// LocalGroup for local ranks that are processes of one machine (the PyTorch
// front's: one Python process per local rank, as torchrun starts them),
// joined by Unix-domain sockets in a star around local rank 0.
//
// Local rank 0 listens at a path in a directory only this user can enter
// and accepts the others, which connect (retrying until it is there) and
// say who they are; once all have, it removes the path. In a collective
// every other member sends local rank 0 what it asked for (and its data
// where local rank 0 needs it), local rank 0 checks that all asked for the
// same, computes and sends each the result. So AllReduceSum adds in
// local-rank order, ((d_0 + d_1) + d_2) + ..., in float32, the same bits as
// ThreadGroup's on every member.
//
// A member that fails breaks the group on every member: local rank 0 sends
// its error to the others, and a process that ends closes its sockets, which
// its peers see at once (UNAVAILABLE naming it). A disagreement fails every
// member with FAILED_PRECONDITION naming both calls; a member that does not
// join within the timeout fails the others with DEADLINE_EXCEEDED naming
// it. After a failure every collective returns ABORTED with the first
// error. Local rank 0 judges the others, so they wait for its reply for
// twice the timeout before they give up on it.
//
// Not thread-safe: one thread at a time per member.
#ifndef CSERPS_WORKER_GROUP_SOCKET_GROUP_H_
#define CSERPS_WORKER_GROUP_SOCKET_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "worker/group/collective_op.h"
#include "worker/group/local_group.h"
#include "worker/group/unix_socket.h"

namespace cserps {

struct SocketGroupOptions {
  // Where local rank 0 listens, the same on every member (at most 107
  // bytes). Its directory is created with mode 0700 when missing.
  std::string path;
  // How long Create waits for every member to join.
  absl::Duration setup_timeout = absl::Minutes(5);
  // How long a collective waits for the other members.
  absl::Duration timeout = absl::Minutes(5);
};

class SocketGroup final : public LocalGroup {
 public:
  // Joins the group of `size` members as `local_rank`; every member calls
  // it with the same path and size. Returns once all have joined. Errors:
  // INVALID_ARGUMENT for a local rank not below the size or an unusable
  // path; ALREADY_EXISTS when another group listens at the path;
  // FAILED_PRECONDITION when two members claim one local rank or disagree
  // on the size; DEADLINE_EXCEEDED naming the members missing at the
  // setup timeout.
  static absl::StatusOr<std::unique_ptr<SocketGroup>> Create(uint32_t local_rank,
                                                             uint32_t size,
                                                             const SocketGroupOptions& options);

  uint32_t local_rank() const override { return local_rank_; }
  uint32_t size() const override { return size_; }

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Broadcast(uint32_t root, absl::Span<float> data) override;

 private:
  SocketGroup(uint32_t local_rank, uint32_t size, absl::Duration timeout);

  absl::Status Run(const CollectiveOp& op, absl::Span<float> data);
  absl::Status RunAsRoot(const CollectiveOp& op, absl::Span<float> data);
  absl::Status RunAsMember(const CollectiveOp& op, absl::Span<float> data);
  // Sends `error` to every member still connected (local rank 0), and keeps
  // it as the group's verdict.
  absl::Status Break(absl::Status error);

  const uint32_t local_rank_;
  const uint32_t size_;
  const absl::Duration timeout_;
  // Local rank 0: peers_[j] is local rank j's connection (peers_[0] unused);
  // the others: peers_[0] is local rank 0's.
  std::vector<UnixSocket> peers_;
  std::vector<float> chunk_;   // local rank 0: a member's data, as it arrives
  uint64_t collectives_ = 0;   // completed, for messages
  absl::Status broken_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_SOCKET_GROUP_H_
