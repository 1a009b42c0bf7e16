// libFuzzer target: the bulk transport's frame reader (docs/protocol.md 17)
// of a live shard. Three one-worker jobs (ssgd, gtopk-ssgd, async-sgd) run
// in this process on 127.0.0.1, registered and initialised; each input
// opens a bulk connection to one of them (the first byte picks which), says hello as
// rank 0 of the job, sends the rest of the input as the connection's bytes
// and closes its side. The shard must answer, and end the connection,
// within the deadline, whatever the bytes, and keep serving.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/socket_io.h"
#include "tests/fuzz/live_shard.h"

namespace cserps {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(10);

// Sends a hello and `bytes`, closes the sending side, and reads what the
// shard answers until it ends the connection; false when it does not
// within the deadline.
bool Exchange(const LiveShard& shard, const uint8_t* bytes, size_t size) {
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::StatusOr<Socket> socket =
      ConnectTcp("127.0.0.1", shard.server->bulk_port(), deadline, "fuzz bulk connection");
  if (!socket.ok()) std::abort();
  char hello[bulk::Hello::kBytes];
  bulk::Encode(bulk::Hello{.fingerprint = shard.fingerprint, .rank = 0}, hello);
  iovec iov[2] = {{hello, sizeof(hello)}, {const_cast<uint8_t*>(bytes), size}};
  // The shard may end the connection before it has read everything.
  SendAll(socket->fd(), absl::MakeSpan(iov), deadline, "fuzz send").IgnoreError();
  shutdown(socket->fd(), SHUT_WR);
  char sink[4096];
  for (;;) {
    if (!WaitFor(socket->fd(), POLLIN, deadline, "fuzz recv").ok()) return false;
    const ssize_t got = recv(socket->fd(), sink, sizeof(sink), 0);
    // The end, or a reset (the shard ended it with bytes unread).
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

}  // namespace
}  // namespace cserps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cserps;  // NOLINT(build/namespaces): a fuzz entry point
  static LiveShard* const dense = StartLiveShard("name: 'ssgd'");
  static LiveShard* const sparse = StartLiveShard("name: 'gtopk-ssgd' density: 0.1");
  static LiveShard* const async = StartLiveShard("name: 'async-sgd'");
  if (size < 1) return 0;
  LiveShard* const shards[] = {dense, sparse, async};
  if (!Exchange(*shards[data[0] % 3], data + 1, size - 1)) std::abort();
  for (LiveShard* shard : shards) {
    if (!shard->client->GetStatus(0).ok()) std::abort();
  }
  return 0;
}
