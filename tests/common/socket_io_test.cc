// The TCP sockets of the bulk transport, on 127.0.0.1: both ends of a new
// connection can take a whole frame of a default chunk before their reader
// runs, and still wake for a single byte; a peek waits for every byte it
// asks for, its deadline or the peer's end, and leaves the socket waking
// for one byte; both ends send keep-alive probes.
#include "common/socket_io.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <ctime>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/block_layout.h"
#include "common/bulk_wire.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

int Option(int fd, int level, int option) {
  int value = 0;
  socklen_t size = sizeof(value);
  EXPECT_EQ(getsockopt(fd, level, option, &value, &size), 0);
  return value;
}
int IntOption(int fd, int option) { return Option(fd, SOL_SOCKET, option); }
int TcpOption(int fd, int option) { return Option(fd, IPPROTO_TCP, option); }

// Both ends of one connection on 127.0.0.1.
struct Pair {
  Socket dialled;
  Socket accepted;
};

absl::StatusOr<Pair> Connected() {
  int port = 0;
  ASSIGN_OR_RETURN(const Socket listener, ListenTcp("127.0.0.1", 0, &port));
  Pair pair;
  ASSIGN_OR_RETURN(pair.dialled, ConnectTcp("127.0.0.1", port, Soon(), "dial"));
  ASSIGN_OR_RETURN(pair.accepted, AcceptTcp(listener));
  return pair;
}

absl::Status SendText(const Socket& s, const char* text) {
  iovec out{const_cast<char*>(text), std::strlen(text)};
  return SendAll(s.fd(), absl::MakeSpan(&out, 1), Soon(), "send");
}

TEST(SocketIoTest, ANewConnectionHoldsAWholeChunkFrameAndWakesForOneByte) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  const int frame = static_cast<int>(kDefaultChunkBytes + bulk::Request::kBytes);
  for (const Socket* end : {&pair->dialled, &pair->accepted}) {
    EXPECT_GE(IntOption(end->fd(), SO_RCVBUF), frame);
    EXPECT_EQ(IntOption(end->fd(), SO_RCVLOWAT), 1);
  }
  ASSERT_TRUE(SendText(pair->dialled, "x").ok());
  char got = 0;
  const absl::Status received = RecvAll(pair->accepted.fd(), &got, 1, Soon(), "receive");
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_EQ(got, 'x');
}

// A deadline centuries away is a finite one whose milliseconds saturate;
// the wait for it sleeps in poll as an infinite one does, where the
// overflowed timeout made it poll without waiting, a core busy (and is
// undefined behaviour, which the sanitizer build stops at).
TEST(SocketIoTest, AFarDeadlineWaitsWithoutSpinning) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  absl::Status received;
  double waiter_cpu_s = -1;
  std::thread waiter([&] {
    timespec start{}, end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    char got = 0;
    received = RecvAll(pair->accepted.fd(), &got, 1, absl::Now() + absl::Seconds(1e17), "far");
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    waiter_cpu_s = double(end.tv_sec - start.tv_sec) + 1e-9 * double(end.tv_nsec - start.tv_nsec);
  });
  // Not a synchronisation: the span over which the waiter's CPU is read.
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(SendText(pair->dialled, "x").ok());
  waiter.join();
  ASSERT_TRUE(received.ok()) << received;
  EXPECT_LT(waiter_cpu_s, 0.1) << "the wait spun";
}

TEST(SocketIoTest, BothEndsProbeAnIdlePeer) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  for (const Socket* s : {&pair->dialled, &pair->accepted}) {
    EXPECT_EQ(IntOption(s->fd(), SO_KEEPALIVE), 1);
    EXPECT_EQ(TcpOption(s->fd(), TCP_KEEPIDLE), kKeepAliveIdleS);
    EXPECT_EQ(TcpOption(s->fd(), TCP_KEEPINTVL), kKeepAliveIntervalS);
    EXPECT_EQ(TcpOption(s->fd(), TCP_KEEPCNT), kKeepAliveProbes);
  }
}

TEST(SocketIoTest, APeekWaitsForEveryByteItAsksForAndLeavesThemToRead) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(SendText(pair->dialled, "ab").ok());
  char peeked[4] = {};
  absl::Status status;
  std::thread peek([&] {
    status = PeekAll(pair->accepted.fd(), peeked, sizeof(peeked), Soon(), "peek");
  });
  ASSERT_TRUE(SendText(pair->dialled, "cd").ok());
  peek.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::string(peeked, 4), "abcd");
  EXPECT_EQ(IntOption(pair->accepted.fd(), SO_RCVLOWAT), 1);
  char read[4] = {};
  ASSERT_TRUE(RecvAll(pair->accepted.fd(), read, sizeof(read), Soon(), "read").ok());
  EXPECT_EQ(std::string(read, 4), "abcd");
}

TEST(SocketIoTest, APeekShortOfItsBytesMeetsItsDeadline) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(SendText(pair->dialled, "ab").ok());
  char peeked[4] = {};
  const absl::Status status = PeekAll(pair->accepted.fd(), peeked, sizeof(peeked),
                                      absl::Now() + absl::Milliseconds(200), "the hello");
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_EQ(IntOption(pair->accepted.fd(), SO_RCVLOWAT), 1);
}

TEST(SocketIoTest, APeekWhosePeerEndsShortOfItsBytesIsUnavailable) {
  absl::StatusOr<Pair> pair = Connected();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(SendText(pair->dialled, "ab").ok());
  pair->dialled = Socket();
  char peeked[4] = {};
  const absl::Status status =
      PeekAll(pair->accepted.fd(), peeked, sizeof(peeked), Soon(), "the hello");
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_EQ(IntOption(pair->accepted.fd(), SO_RCVLOWAT), 1);
}

}  // namespace
}  // namespace cserps
