#include "worker/group/socket_group.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace cserps {
namespace {

constexpr uint32_t kMagic = 0x50475343;  // "CSGP"
constexpr uint32_t kVersion = 1;
// Longest error message a member accepts from local rank 0.
constexpr uint32_t kMaxMessage = 1 << 16;
// How long local rank 0 tries to hand a short reply to a member (a welcome
// or a failure), which has room for it unless it is gone.
constexpr absl::Duration kErrorSendTimeout = absl::Seconds(5);
// Floats local rank 0 receives at a time while it adds a member's data.
constexpr size_t kChunkFloats = size_t{1} << 18;

// A member's first message.
struct Hello {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t local_rank = 0;
  uint32_t size = 0;
};

// What a member asks for in a collective.
struct Request {
  uint32_t kind = 0;
  uint32_t root = 0;
  uint64_t count = 0;
};

// Local rank 0's answer: OK and the data the member needs, or an error and
// its message.
struct Reply {
  uint32_t code = 0;
  uint32_t message_size = 0;
};

absl::Status SendReply(UnixSocket& socket, const absl::Status& status, absl::Time deadline) {
  const std::string message(status.message().substr(0, kMaxMessage));
  const Reply reply{static_cast<uint32_t>(status.code()),
                    static_cast<uint32_t>(message.size())};
  RETURN_IF_ERROR(socket.Send(&reply, sizeof(reply), deadline));
  return socket.Send(message.data(), message.size(), deadline);
}

// OK, or the error local rank 0 sent.
absl::Status ReceiveReply(UnixSocket& socket, absl::Time deadline) {
  Reply reply;
  RETURN_IF_ERROR(socket.Receive(&reply, sizeof(reply), deadline));
  if (reply.code == 0) return absl::OkStatus();
  std::string message(std::min(reply.message_size, kMaxMessage), '\0');
  RETURN_IF_ERROR(socket.Receive(message.data(), message.size(), deadline));
  return absl::Status(static_cast<absl::StatusCode>(reply.code), message);
}

// `status` with `context` in front of its message.
absl::Status Prefixed(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::Status SendFloats(UnixSocket& socket, absl::Span<const float> data, absl::Time deadline,
                        bool* stopped) {
  return socket.Send(data.data(), data.size() * sizeof(float), deadline,
                     /*stop_if_readable=*/true, stopped);
}

// Local rank 0's side of Create: accepts the others until all have said
// hello; their sockets by local rank.
absl::StatusOr<std::vector<UnixSocket>> AcceptMembers(uint32_t size,
                                                      const SocketGroupOptions& options) {
  ASSIGN_OR_RETURN(UnixListener listener,
                   UnixListener::Listen(options.path, static_cast<int>(size)));
  std::vector<UnixSocket> peers(size);
  const absl::Time deadline = absl::Now() + options.setup_timeout;
  uint32_t joined = 1;
  absl::Status failure;
  while (joined < size && failure.ok()) {
    absl::StatusOr<UnixSocket> accepted = listener.Accept(deadline);
    if (absl::IsDeadlineExceeded(accepted.status())) {
      std::vector<uint32_t> missing;
      for (uint32_t j = 1; j < size; ++j) {
        if (!peers[j].valid()) missing.push_back(j);
      }
      failure = absl::DeadlineExceededError(absl::StrCat(
          "local rank(s) ", absl::StrJoin(missing, ", "), " did not join the group at ",
          options.path, " within ", absl::FormatDuration(options.setup_timeout)));
      break;
    }
    RETURN_IF_ERROR(accepted.status());
    Hello hello;
    // A connection that does not say hello at once is not a member's.
    const absl::Time hello_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
    if (!accepted->Receive(&hello, sizeof(hello), hello_deadline).ok() ||
        hello.magic != kMagic) {
      continue;
    }
    if (hello.version != kVersion || hello.size != size) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "a member of the group at ", options.path, " says it has ", hello.size,
          " members (protocol ", hello.version, "); local rank 0 says ", size, " (protocol ",
          kVersion, ")"));
    } else if (hello.local_rank == 0 || hello.local_rank >= size) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "a member of the group at ", options.path, " claims local rank ", hello.local_rank,
          ", not one of 1..", size - 1));
    } else if (peers[hello.local_rank].valid()) {
      failure = absl::FailedPreconditionError(absl::StrCat(
          "two processes claim local rank ", hello.local_rank, " of the group at ",
          options.path));
    }
    if (failure.ok()) {
      peers[hello.local_rank] = *std::move(accepted);
      ++joined;
    } else {
      (void)SendReply(*accepted, failure, absl::Now() + kErrorSendTimeout);
    }
  }
  for (uint32_t j = 1; j < size; ++j) {
    if (!peers[j].valid()) continue;
    const absl::Status sent = SendReply(peers[j], failure, absl::Now() + kErrorSendTimeout);
    if (failure.ok() && !sent.ok()) {
      failure = Prefixed(sent, absl::StrCat("welcoming local rank ", j));
    }
  }
  RETURN_IF_ERROR(failure);
  return peers;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SocketGroup>> SocketGroup::Create(
    uint32_t local_rank, uint32_t size, const SocketGroupOptions& options) {
  if (size == 0 || local_rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", local_rank, " is not a member of a group of ", size));
  }
  std::unique_ptr<SocketGroup> group(new SocketGroup(local_rank, size, options.timeout));
  if (size == 1) return group;
  const std::string context =
      absl::StrCat("local rank ", local_rank, ": joining the group at ", options.path);
  if (local_rank == 0) {
    absl::StatusOr<std::vector<UnixSocket>> peers = AcceptMembers(size, options);
    if (!peers.ok()) return Prefixed(peers.status(), context);
    group->peers_ = *std::move(peers);
    return group;
  }
  // Local rank 0 may wait for the last member for up to its setup timeout.
  const absl::Time deadline = absl::Now() + 2 * options.setup_timeout;
  absl::StatusOr<UnixSocket> socket =
      UnixSocket::Connect(options.path, absl::Now() + options.setup_timeout);
  if (!socket.ok()) return Prefixed(socket.status(), context);
  const Hello hello{kMagic, kVersion, local_rank, size};
  absl::Status status = socket->Send(&hello, sizeof(hello), deadline);
  if (status.ok()) status = ReceiveReply(*socket, deadline);
  if (!status.ok()) return Prefixed(status, context);
  group->peers_.push_back(*std::move(socket));
  return group;
}

SocketGroup::SocketGroup(uint32_t local_rank, uint32_t size, absl::Duration timeout)
    : local_rank_(local_rank), size_(size), timeout_(timeout) {}

absl::Status SocketGroup::AllReduceSum(absl::Span<float> data) {
  return Run({CollectiveKind::kAllReduceSum, 0, data.size()}, data);
}

absl::Status SocketGroup::Broadcast(uint32_t root, absl::Span<float> data) {
  if (root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast on local rank ", local_rank_, ": root ", root,
        " is not a local rank of a group of ", size_));
  }
  return Run({CollectiveKind::kBroadcast, root, data.size()}, data);
}

absl::Status SocketGroup::Run(const CollectiveOp& op, absl::Span<float> data) {
  const std::string what = absl::StrCat(Describe(op), " (collective #", collectives_,
                                        ") on local rank ", local_rank_);
  if (!broken_.ok()) {
    return absl::AbortedError(
        absl::StrCat(what, ": the local group failed earlier: ", broken_.message()));
  }
  if (size_ == 1) return absl::OkStatus();
  absl::Status status = local_rank_ == 0 ? RunAsRoot(op, data) : RunAsMember(op, data);
  if (!status.ok()) return Break(Prefixed(status, what));
  ++collectives_;
  return absl::OkStatus();
}

absl::Status SocketGroup::RunAsRoot(const CollectiveOp& op, absl::Span<float> data) {
  const absl::Time deadline = absl::Now() + timeout_;
  // Every member's request, waited for together so that a timeout names
  // all that are missing.
  std::vector<bool> asked(size_, false);
  asked[0] = true;
  uint32_t waiting = size_ - 1;
  while (waiting > 0) {
    std::vector<pollfd> fds;
    std::vector<uint32_t> ranks;
    for (uint32_t j = 1; j < size_; ++j) {
      if (asked[j]) continue;
      fds.push_back({peers_[j].fd(), POLLIN, 0});
      ranks.push_back(j);
    }
    const absl::Duration left = deadline - absl::Now();
    const int n = left <= absl::ZeroDuration()
                      ? 0
                      : poll(fds.data(), fds.size(),
                             static_cast<int>(std::max<int64_t>(
                                 1, std::min<int64_t>(absl::ToInt64Milliseconds(left),
                                                      1 << 30))));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, "poll");
    if (n == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "local rank(s) ", absl::StrJoin(ranks, ", "), " did not join within ",
          absl::FormatDuration(timeout_)));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const uint32_t j = ranks[i];
      Request request;
      const absl::Status received = peers_[j].Receive(&request, sizeof(request), deadline);
      if (!received.ok()) {
        return Prefixed(received, absl::StrCat("local rank ", j, " (did its process end?)"));
      }
      const CollectiveOp theirs{static_cast<CollectiveKind>(request.kind), request.root,
                                request.count};
      if (!(theirs == op)) {
        return absl::FailedPreconditionError(
            absl::StrCat("local rank ", j, " called ", Describe(theirs), " instead"));
      }
      asked[j] = true;
      --waiting;
    }
  }
  if (op.kind == CollectiveKind::kAllReduceSum) {
    chunk_.resize(std::min(kChunkFloats, data.size()));
    for (uint32_t j = 1; j < size_; ++j) {
      for (size_t begin = 0; begin < data.size(); begin += chunk_.size()) {
        const size_t n = std::min(chunk_.size(), data.size() - begin);
        const absl::Status received =
            peers_[j].Receive(chunk_.data(), n * sizeof(float), deadline);
        if (!received.ok()) {
          return Prefixed(received, absl::StrCat("local rank ", j, " (did its process end?)"));
        }
        float* sum = data.data() + begin;
        for (size_t i = 0; i < n; ++i) sum[i] += chunk_[i];
      }
    }
  } else if (op.root != 0) {
    const absl::Status received =
        peers_[op.root].Receive(data.data(), data.size() * sizeof(float), deadline);
    if (!received.ok()) {
      return Prefixed(received, absl::StrCat("local rank ", op.root, " (did its process end?)"));
    }
  }
  for (uint32_t j = 1; j < size_; ++j) {
    absl::Status sent = SendReply(peers_[j], absl::OkStatus(), deadline);
    const bool gets_data = op.kind == CollectiveKind::kAllReduceSum || j != op.root;
    if (sent.ok() && gets_data) {
      sent = peers_[j].Send(data.data(), data.size() * sizeof(float), deadline);
    }
    if (!sent.ok()) {
      return Prefixed(sent, absl::StrCat("local rank ", j, " (did its process end?)"));
    }
  }
  return absl::OkStatus();
}

absl::Status SocketGroup::RunAsMember(const CollectiveOp& op, absl::Span<float> data) {
  const absl::Time deadline = absl::Now() + 2 * timeout_;
  UnixSocket& root = peers_[0];
  const Request request{static_cast<uint32_t>(op.kind), op.root, op.count};
  // Local rank 0 answers before it has all the data only with an error.
  bool stopped = false;
  absl::Status sent = root.Send(&request, sizeof(request), deadline,
                                /*stop_if_readable=*/true, &stopped);
  const bool sends_data = op.kind == CollectiveKind::kAllReduceSum || op.root == local_rank_;
  if (sent.ok() && !stopped && sends_data) sent = SendFloats(root, data, deadline, &stopped);
  Reply reply;
  absl::Status received = sent;
  if (received.ok()) received = root.Receive(&reply, sizeof(reply), deadline);
  if (received.ok() && reply.code != 0) {
    std::string message(std::min(reply.message_size, kMaxMessage), '\0');
    received = root.Receive(message.data(), message.size(), deadline);
    if (received.ok()) return absl::Status(static_cast<absl::StatusCode>(reply.code), message);
  }
  const bool gets_data = op.kind == CollectiveKind::kAllReduceSum || op.root != local_rank_;
  if (received.ok() && gets_data) {
    received = root.Receive(data.data(), data.size() * sizeof(float), deadline);
  }
  if (absl::IsDeadlineExceeded(received)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer from local rank 0 within ", absl::FormatDuration(2 * timeout_)));
  }
  if (!received.ok()) return Prefixed(received, "local rank 0 (did its process end?)");
  return absl::OkStatus();
}

absl::Status SocketGroup::Break(absl::Status error) {
  if (local_rank_ == 0) {
    for (uint32_t j = 1; j < peers_.size(); ++j) {
      if (peers_[j].valid()) (void)SendReply(peers_[j], error, absl::Now() + kErrorSendTimeout);
    }
  }
  for (UnixSocket& peer : peers_) peer.Close();
  broken_ = error;
  return error;
}

}  // namespace cserps
