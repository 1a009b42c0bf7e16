// ByteStream over TLS on 127.0.0.1, with certificates from
// tools/make_certs.sh: both ends sending and receiving at once get every
// byte, headers and payloads alike; a peer gone is a send's error; a
// shard's certificate is checked against the host the worker dialled; a
// client certificate of another CA is refused and counted; a silent peer
// and a closed one are named errors.
#include "common/byte_stream.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/job_certificates.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

class ByteStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::path(::testing::TempDir()) / absl::StrCat("byte_stream_test.", getpid());
    for (const char* job : {"job", "other"}) {
      ASSERT_TRUE(testing::MakeJobCertificates(CSERPS_SOURCE_DIR, (root_ / job).string()));
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // `who`'s files of `job`, trusting the CAs of the `trusted` jobs.
  static TlsFiles Files(const char* job, const char* who,
                        std::vector<const char*> trusted = {"job"}) {
    TlsFiles files;
    for (const char* t : trusted) files.ca_pem += Read(root_ / t / "ca.pem");
    files.cert_pem = Read(root_ / job / absl::StrCat(who, ".pem"));
    files.key_pem = Read(root_ / job / absl::StrCat(who, ".key"));
    return files;
  }
  static std::string Read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  void SetUp() override {
    int port = 0;
    absl::StatusOr<Socket> listener = ListenTcp("127.0.0.1", 0, &port);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    port_ = port;
    absl::StatusOr<std::shared_ptr<TlsContext>> shard =
        TlsContext::ForServer(Files("job", "server"), nullptr);
    absl::StatusOr<std::shared_ptr<TlsContext>> worker =
        TlsContext::ForClient(Files("job", "client"));
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(worker.ok()) << worker.status();
    shard_tls_ = *std::move(shard);
    worker_tls_ = *std::move(worker);
  }

  // The shard's end of the next connection, before its handshake.
  absl::StatusOr<std::unique_ptr<ByteStream>> AcceptOne(const TlsContext& tls) {
    ASSIGN_OR_RETURN(Socket socket, AcceptTcp(listener_));
    return ByteStream::Tls(std::move(socket), tls, "");
  }
  // A worker's end, dialling 127.0.0.1 and checking the shard's
  // certificate against `host`.
  absl::StatusOr<std::unique_ptr<ByteStream>> Dial(const TlsContext& tls,
                                                   const std::string& host = "127.0.0.1") {
    ASSIGN_OR_RETURN(Socket socket, ConnectTcp("127.0.0.1", port_, Soon(), "dial"));
    return ByteStream::Tls(std::move(socket), tls, host);
  }

  static fs::path root_;
  Socket listener_;
  int port_ = 0;
  // The job's shard and worker.
  std::shared_ptr<TlsContext> shard_tls_;
  std::shared_ptr<TlsContext> worker_tls_;
};

fs::path ByteStreamTest::root_;

// A message as the bulk transport sends one: a small header, then a large
// payload, gathered from two pieces.
struct Message {
  char head[48];
  std::vector<char> payload;
};

Message MakeMessage(int i, size_t bytes) {
  Message m;
  for (size_t b = 0; b < sizeof(m.head); ++b) m.head[b] = static_cast<char>(i * 31 + b);
  m.payload.resize(bytes);
  for (size_t b = 0; b < bytes; ++b) m.payload[b] = static_cast<char>((b * 7 + i) % 251);
  return m;
}

absl::Status Send(ByteStream& s, Message& m) {
  iovec iov[2] = {{m.head, sizeof(m.head)}, {m.payload.data(), m.payload.size()}};
  return s.SendAll(absl::MakeSpan(iov), Soon(), "send");
}

absl::Status Receive(ByteStream& s, Message* m) {
  iovec iov[2] = {{m->head, sizeof(m->head)}, {m->payload.data(), m->payload.size()}};
  return s.RecvAll(absl::MakeSpan(iov), Soon(), "receive");
}

// How far the shard's reader is, for its writer.
struct Progress {
  size_t received = 0;
  size_t next = 0;  // the writer's
  bool failed = false;
  bool Due() const { return failed || received > next; }
};

// Each end's reader and writer run at once on one stream, with messages
// larger than the sockets hold, so each side's writes wait while its reads
// go on.
TEST_F(ByteStreamTest, BothEndsSendAndReceiveAtOnceAndGetEveryByte) {
  const std::vector<size_t> sizes = {0, 1, 16 << 10, (16 << 10) - 47, 3 << 20, 5 << 20};
  absl::Status echoed;
  std::thread server([&] {
    absl::StatusOr<std::unique_ptr<ByteStream>> s = AcceptOne(*shard_tls_);
    if (!s.ok()) {
      echoed = s.status();
      return;
    }
    echoed = (*s)->Handshake(Soon(), "accept");
    // The shard's reader hands each message to its writer, which sends it
    // back while the reader reads the next.
    std::vector<Message> got(sizes.size());
    absl::Mutex mu;
    Progress progress;
    std::thread writer([&] {
      for (size_t i = 0; i < sizes.size(); ++i) {
        {
          absl::MutexLock lock(&mu);
          progress.next = i;
          mu.Await(absl::Condition(&progress, &Progress::Due));
          if (progress.failed) return;
        }
        if (!Send(**s, got[i]).ok()) return;
      }
    });
    for (size_t i = 0; i < sizes.size() && echoed.ok(); ++i) {
      got[i].payload.resize(sizes[i]);
      echoed = Receive(**s, &got[i]);
      absl::MutexLock lock(&mu);
      progress.received = i + 1;
      progress.failed = !echoed.ok();
    }
    writer.join();
  });
  absl::StatusOr<std::unique_ptr<ByteStream>> c = Dial(*worker_tls_);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Handshake(Soon(), "connect").ok());
  EXPECT_TRUE((*c)->tls());
  std::vector<Message> sent;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(MakeMessage(static_cast<int>(i), sizes[i]));
  }
  absl::Status sending;
  std::thread writer([&] {
    for (Message& m : sent) {
      sending = Send(**c, m);
      if (!sending.ok()) return;
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    Message back;
    back.payload.resize(sizes[i]);
    absl::Status received = Receive(**c, &back);
    ASSERT_TRUE(received.ok()) << received;
    EXPECT_EQ(std::memcmp(back.head, sent[i].head, sizeof(back.head)), 0) << i;
    EXPECT_TRUE(back.payload == sent[i].payload) << "message " << i << " of " << sizes[i];
  }
  writer.join();
  server.join();
  EXPECT_TRUE(sending.ok()) << sending;
  EXPECT_TRUE(echoed.ok()) << echoed;
}

// Writing to a connection its peer has closed is the send's error, not a
// SIGPIPE that ends the process.
TEST_F(ByteStreamTest, SendingToAPeerThatHasGoneIsUnavailable) {
  std::thread server([&] {
    absl::StatusOr<std::unique_ptr<ByteStream>> s = AcceptOne(*shard_tls_);
    if (s.ok()) (*s)->Handshake(Soon(), "accept").IgnoreError();
  });  // the shard's end closes here
  absl::StatusOr<std::unique_ptr<ByteStream>> c = Dial(*worker_tls_);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->Handshake(Soon(), "connect").ok());
  server.join();
  Message m = MakeMessage(0, 1 << 20);
  absl::Status sent;
  // The first sends may still land in the socket's buffer; the peer's reset
  // fails a later one.
  for (int i = 0; i < 64 && sent.ok(); ++i) sent = Send(**c, m);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_THAT(sent.message(), HasSubstr("send"));
}

TEST_F(ByteStreamTest, AShardsCertificateNotValidForTheDialledHostIsRefused) {
  std::thread server([&] {
    absl::StatusOr<std::unique_ptr<ByteStream>> s = AcceptOne(*shard_tls_);
    if (s.ok()) (*s)->Handshake(Soon(), "accept").IgnoreError();  // fails: the client gives up
  });
  absl::StatusOr<std::unique_ptr<ByteStream>> c = Dial(*worker_tls_, "elsewhere.example");
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status handshake = (*c)->Handshake(Soon(), "connect");
  server.join();
  EXPECT_EQ(handshake.code(), absl::StatusCode::kUnauthenticated) << handshake;
  EXPECT_THAT(handshake.message(), HasSubstr("hostname mismatch"));
}

TEST_F(ByteStreamTest, AClientCertificateOfAnotherCaIsRefusedAndCounted) {
  std::atomic<uint64_t> refused{0};
  auto server_tls = TlsContext::ForServer(Files("job", "server"), &refused);
  // It trusts the job's CA, so it accepts the shard; its own certificate is
  // the other job's.
  auto stranger_tls = TlsContext::ForClient(Files("other", "client", {"job", "other"}));
  ASSERT_TRUE(server_tls.ok() && stranger_tls.ok());
  absl::Status accepted;
  std::thread server([&] {
    absl::StatusOr<std::unique_ptr<ByteStream>> s = AcceptOne(**server_tls);
    accepted = s.ok() ? (*s)->Handshake(Soon(), "accept") : s.status();
  });
  absl::StatusOr<std::unique_ptr<ByteStream>> c = Dial(**stranger_tls);
  ASSERT_TRUE(c.ok()) << c.status();
  // TLS 1.3: the client's side may finish before the shard has checked its
  // certificate; the refusal then ends the first read.
  absl::Status stranger = (*c)->Handshake(Soon(), "connect");
  char byte;
  if (stranger.ok()) stranger = (*c)->RecvAll(&byte, 1, Soon(), "receive");
  server.join();
  EXPECT_FALSE(stranger.ok());
  EXPECT_EQ(accepted.code(), absl::StatusCode::kUnauthenticated) << accepted;
  EXPECT_THAT(accepted.message(), HasSubstr("certificate"));
  EXPECT_EQ(refused.load(), 1u);
}

TEST_F(ByteStreamTest, ASilentPeerIsADeadlineAndAClosedOneIsUnavailable) {
  // The listener's backlog completes the connection; nobody answers.
  absl::StatusOr<std::unique_ptr<ByteStream>> silent = Dial(*worker_tls_);
  ASSERT_TRUE(silent.ok()) << silent.status();
  const absl::Status waited =
      (*silent)->Handshake(absl::Now() + absl::Milliseconds(300), "silent shard");
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("silent shard"));

  absl::StatusOr<Socket> peer = AcceptTcp(listener_);
  ASSERT_TRUE(peer.ok()) << peer.status();
  *peer = Socket();  // closed
  const absl::Status closed = (*silent)->Handshake(Soon(), "closed shard");
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;
  EXPECT_THAT(closed.message(), HasSubstr("closed shard"));
}

}  // namespace
}  // namespace cserps
