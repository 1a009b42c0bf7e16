// The TCP sockets of the bulk transport, on 127.0.0.1: both ends of a new
// connection can take a whole frame of a default chunk before their reader
// runs, and still wake for a single byte.
#include "common/socket_io.h"

#include <sys/socket.h>

#include "absl/time/clock.h"
#include "common/block_layout.h"
#include "common/bulk_wire.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

int IntOption(int fd, int option) {
  int value = 0;
  socklen_t size = sizeof(value);
  EXPECT_EQ(getsockopt(fd, SOL_SOCKET, option, &value, &size), 0);
  return value;
}

TEST(SocketIoTest, ANewConnectionHoldsAWholeChunkFrameAndWakesForOneByte) {
  int port = 0;
  absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> dialled =
      ConnectTcp("127.0.0.1", port, absl::Now() + absl::Seconds(20), "dial");
  ASSERT_TRUE(dialled.ok()) << dialled.status();
  absl::StatusOr<Socket> accepted = AcceptTcp(*listener);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  const int frame = static_cast<int>(kDefaultChunkBytes + bulk::Request::kBytes);
  for (const Socket* end : {&*dialled, &*accepted}) {
    EXPECT_GE(IntOption(end->fd(), SO_RCVBUF), frame);
    EXPECT_EQ(IntOption(end->fd(), SO_RCVLOWAT), 1);
  }
  char byte = 'x';
  iovec out{&byte, 1};
  ASSERT_TRUE(SendAll(dialled->fd(), absl::MakeSpan(&out, 1), absl::Now() + absl::Seconds(20),
                      "send")
                  .ok());
  char got = 0;
  iovec in{&got, 1};
  const absl::Status received = RecvAll(accepted->fd(), absl::MakeSpan(&in, 1),
                                        absl::Now() + absl::Seconds(20), "receive");
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_EQ(got, 'x');
}

}  // namespace
}  // namespace cserps
