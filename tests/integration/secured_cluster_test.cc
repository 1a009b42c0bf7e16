// A shard with mutual TLS and a job token, in-process on 127.0.0.1, and
// PsClients with the job's certificates and token, another CA's, no token
// or a wrong one: only the first trains, the others are refused, counted by
// reason, and change nothing. Certificates come from tools/make_certs.sh.
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bulk_wire.h"
#include "common/byte_stream.h"
#include "common/config.h"
#include "common/config_fingerprint.h"
#include "common/transport_security.h"
#include "common/metrics.h"
#include "common/socket_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/testing/job_certificates.h"
#include "tools/cluster/child_process.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/ps/bulk_channel.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// d = 20 * 5 + 5 = 105 floats on one shard.
constexpr uint64_t kD = 105;
constexpr char kJob[] = R"pb(
  name: "secured-test"
  cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 20 }
  model { kind: SOFTMAX input_dim: 20 num_classes: 5 }
  data { batch_size: 1 }
  optimizer { lr: 0.5 }
  algorithm { name: "ssgd" block_size: 8 }
  epochs: 1
)pb";

// The certificates of two jobs (their CAs differ), made once.
class SecuredClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::path(::testing::TempDir()) / absl::StrCat("secured_cluster_test.", getpid());
    for (const char* job : {"job", "other"}) {
      ASSERT_TRUE(testing::MakeJobCertificates(CSERPS_SOURCE_DIR, (root_ / job).string())) << job;
    }
    // Trusts both CAs: a stranger who trusts the job's servers and whose own
    // certificate passes its own checks.
    std::ofstream both(root_ / "both-ca.pem");
    both << std::ifstream(File("job", "ca.pem")).rdbuf() << std::ifstream(File("other", "ca.pem")).rdbuf();
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static std::string File(const char* job, const char* name) {
    return (root_ / job / name).string();
  }

  // The job with `security` (text of a SecurityConfig).
  static v1::JobConfig Config(const std::string& security) {
    return testing::TestConfig(absl::StrCat(kJob, " security { ", security, " }"));
  }
  static std::string Tls(const char* job, const char* who,
                         const std::string& ca = File("job", "ca.pem")) {
    return absl::StrCat("ca_cert: '", ca, "' cert: '", File(job, who), ".pem' key: '",
                        File(job, who), ".key'");
  }
  static std::string Token(const char* job) {
    return absl::StrCat(" token_file: '", File(job, "token"), "'");
  }

  void StartServer(const std::string& security) {
    metrics_ = MetricsRegistry::WithoutEndpoint();
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        PsServer::Start(Config(security), 0, "127.0.0.1:0", {}, metrics_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A client of the job at the server's address with `security`.
  std::unique_ptr<PsClient> Client(const std::string& security) {
    v1::JobConfig config = Config(security);
    config.mutable_cluster()->set_servers(0, server_->address());
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(config, kD, {.setup_timeout = absl::Seconds(5)});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // cserps_server_refused_total{reason=...} of shard 0.
  double Refused(const std::string& reason) const {
    const std::string text = metrics_->Collect();
    const std::regex line(absl::StrCat("cserps_server_refused_total\\{[^}]*reason=\"", reason,
                                       "\"[^}]*\\} ([0-9.e+]+)"));
    std::smatch m;
    EXPECT_TRUE(std::regex_search(text, m, line)) << reason << "\n" << text;
    return m.empty() ? -1 : std::stod(m[1].str());
  }

  static fs::path root_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<PsServer> server_;
};

fs::path SecuredClusterTest::root_;

// What `child` prints until it prints `until` (empty: until its output
// ends), for at most 30 s.
std::string ReadOutput(ChildProcess& child, const std::string& until) {
  std::string output;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (child.output_fd() >= 0 && absl::Now() < deadline &&
         (until.empty() || output.find(until) == std::string::npos)) {
    pollfd fd{child.output_fd(), POLLIN, 0};
    poll(&fd, 1, 1000);
    for (const std::string& line : child.ReadLines()) output += line + "\n";
  }
  return output;
}

TEST_F(SecuredClusterTest, WorkersWithTheJobsCertificatesAndTokenTrain) {
  StartServer(Tls("job", "server") + Token("job"));
  ASSERT_NE(server_->bulk_port(), 0) << "a secured shard offers the bulk transport over TLS";
  std::unique_ptr<PsClient> clients[2] = {Client(Tls("job", "client") + Token("job")),
                                          Client(Tls("job", "client") + Token("job"))};
  ASSERT_TRUE(clients[0] != nullptr && clients[1] != nullptr);
  std::vector<float> x0(kD);
  for (uint64_t i = 0; i < kD; ++i) x0[i] = static_cast<float>(i) / 8;
  std::vector<float> means[2] = {std::vector<float>(kD), std::vector<float>(kD)};
  std::vector<std::thread> ranks;
  absl::Status status[2];
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      status[r] = clients[r]->Register(r, absl::StrCat("secured-", r)).status();
      if (status[r].ok() && r == 0) status[r] = clients[r]->PushModel(x0);
      std::vector<float> x(kD);
      if (status[r].ok()) status[r] = clients[r]->PullModel(absl::MakeSpan(x), true);
      const std::vector<float> values(kD, static_cast<float>(r + 1));
      if (status[r].ok()) {
        status[r] = clients[r]->AverageBlocks(v1::MODEL, 0, 1, values, 1.0f, 0.0f,
                                              absl::MakeSpan(means[r]));
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(means[0], std::vector<float>(kD, 1.5f));
  EXPECT_EQ(means[1], means[0]);
  // The round went over the bulk connections (TLS, with the token in the
  // hello): one 48-byte-header frame out, one 24-byte-header frame back.
  for (const auto& client : clients) {
    const TrafficCounts traffic = client->traffic(v1::MODEL);
    EXPECT_EQ(traffic.request_bytes, bulk::Request::kBytes + kD * sizeof(float));
    EXPECT_EQ(traffic.reply_bytes, bulk::Reply::kBytes + kD * sizeof(float));
  }
  EXPECT_EQ(Refused("unauthenticated"), 0);
  EXPECT_EQ(Refused("bad_certificate"), 0);
}

TEST_F(SecuredClusterTest, AClientCertificateOfAnotherCaIsRefusedAndCounted) {
  StartServer(Tls("job", "server") + Token("job"));
  // It trusts the job's CA, so it accepts the server, and even has the
  // token; its own certificate is the other job's.
  std::unique_ptr<PsClient> stranger =
      Client(Tls("other", "client", (root_ / "both-ca.pem").string()) + Token("job"));
  ASSERT_NE(stranger, nullptr);
  absl::StatusOr<uint32_t> rank = stranger->Register(0, "stranger");
  EXPECT_FALSE(rank.ok());
  EXPECT_THAT(rank.status().message(), HasSubstr("the connection fails"));
  EXPECT_GE(Refused("bad_certificate"), 1);
  EXPECT_EQ(Refused("unauthenticated"), 0);
  // Nothing registered: the job's own worker still gets rank 0.
  std::unique_ptr<PsClient> worker = Client(Tls("job", "client") + Token("job"));
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<uint32_t> own = worker->Register(0, "worker-0");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(*own, 0u);
}

// A connection that never starts its TLS handshake is closed by the server
// after PsServer::kHandshakeTimeout (gRPC's default would keep it 120 s).
TEST_F(SecuredClusterTest, ASilentConnectionIsClosedAfterTheHandshakeTimeout) {
  StartServer(Tls("job", "server") + Token("job"));
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort(server_->address(), &host, &port).ok());
  absl::StatusOr<Socket> silent =
      ConnectTcp(host, port, absl::Now() + absl::Seconds(10), "the silent connection");
  ASSERT_TRUE(silent.ok()) << silent.status();
  pollfd readable{silent->fd(), POLLIN, 0};
  const int limit_ms =
      static_cast<int>(absl::ToInt64Milliseconds(2 * PsServer::kHandshakeTimeout));
  const int ready = poll(&readable, 1, limit_ms);
  char byte;
  const ssize_t got = ready == 1 ? recv(silent->fd(), &byte, 1, 0) : -1;
  ASSERT_EQ(ready, 1) << "the silent connection is still open after " << limit_ms << " ms";
  EXPECT_EQ(got, 0) << "the server sent data on a connection that said nothing";
}

TEST_F(SecuredClusterTest, ACallWithoutTheTokenOrWithAnotherIsUnauthenticated) {
  StartServer(Tls("job", "server") + Token("job"));
  struct Case {
    const char* name;
    std::string security;
    const char* message;
  };
  const Case cases[] = {
      {"no token", Tls("job", "client"), "carries no job token"},
      {"another job's token", Tls("job", "client") + Token("other"), "is not this job's"},
  };
  double refused = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<PsClient> client = Client(c.security);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<uint32_t> rank = client->Register(0, "intruder");
    EXPECT_EQ(rank.status().code(), absl::StatusCode::kUnauthenticated) << rank.status();
    EXPECT_THAT(rank.status().message(), HasSubstr(c.message));
    absl::StatusOr<v1::GetStatusResponse> status = client->GetStatus(0);
    EXPECT_EQ(status.status().code(), absl::StatusCode::kUnauthenticated);
    refused += 2;
    EXPECT_EQ(Refused("unauthenticated"), refused);
  }
  std::unique_ptr<PsClient> worker = Client(Tls("job", "client") + Token("job"));
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<v1::GetStatusResponse> status = worker->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->registered(), 0u) << "a refused Register registered a rank";
}

// The token works without TLS too (on loopback, or with --insecure).
TEST_F(SecuredClusterTest, TheTokenIsCheckedWithoutTls) {
  StartServer(Token("job"));
  std::unique_ptr<PsClient> intruder = Client("");
  ASSERT_NE(intruder, nullptr);
  EXPECT_EQ(intruder->Register(0, "intruder").status().code(),
            absl::StatusCode::kUnauthenticated);
  std::unique_ptr<PsClient> worker = Client(Token("job"));
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<uint32_t> rank = worker->Register(0, "worker-0");
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(Refused("unauthenticated"), 1);
}

// A secured shard's bulk port asks for the job's certificate first (a
// refused one is counted), then for the token in the hello, before it says
// anything of the job: each refusal names what was wrong, and the job's
// credentials get as far as the hello's rank.
TEST_F(SecuredClusterTest, TheBulkPortChecksTheCertificateThenTheToken) {
  StartServer(Tls("job", "server") + Token("job"));
  ASSERT_NE(server_->bulk_port(), 0);
  const v1::JobConfig job = Config("");
  auto connect = [&](const std::string& security) {
    absl::StatusOr<TransportSecurity> loaded = LoadTransportSecurity(Config(security).security(), TlsRole::kWorker);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    BulkChannel::Credentials credentials{.tls = nullptr, .token = loaded->token};
    if (loaded->tls.has_value()) credentials.tls = *TlsContext::ForClient(*loaded->tls);
    return BulkChannel::Connect("127.0.0.1", server_->bulk_port(), JobFingerprint(job), 0,
                                credentials, absl::Now() + absl::Seconds(10), "shard 0")
        .status();
  };
  const absl::Status stranger =
      connect(Tls("other", "client", (root_ / "both-ca.pem").string()) + Token("job"));
  EXPECT_FALSE(stranger.ok());
  EXPECT_EQ(Refused("bad_certificate"), 1);
  const absl::Status plaintext = connect(Token("job"));
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnauthenticated) << plaintext;
  EXPECT_THAT(plaintext.message(), HasSubstr("requires TLS"));

  const absl::Status no_token = connect(Tls("job", "client"));
  EXPECT_EQ(no_token.code(), absl::StatusCode::kUnauthenticated) << no_token;
  EXPECT_THAT(no_token.message(), HasSubstr("the bulk hello carries no job token"));
  const absl::Status other_token = connect(Tls("job", "client") + Token("other"));
  EXPECT_EQ(other_token.code(), absl::StatusCode::kUnauthenticated) << other_token;
  EXPECT_THAT(other_token.message(), HasSubstr("is not this job's"));
  EXPECT_EQ(Refused("unauthenticated"), 2);

  // Rank 0 has not registered: the job's credentials passed both checks.
  const absl::Status own = connect(Tls("job", "client") + Token("job"));
  EXPECT_EQ(own.code(), absl::StatusCode::kFailedPrecondition) << own;
  EXPECT_THAT(own.message(), HasSubstr("rank 0"));
  EXPECT_EQ(Refused("bad_certificate"), 1);
  EXPECT_EQ(Refused("unauthenticated"), 2);
}

TEST_F(SecuredClusterTest, AServerWithAKeyThatIsNotItsCertificatesDoesNotStart) {
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(
      Config(absl::StrCat("ca_cert: '", File("job", "ca.pem"), "' cert: '",
                          File("job", "server.pem"), "' key: '", File("job", "client.key"),
                          "'")),
      0, "127.0.0.1:0");
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(),
              AllOf(HasSubstr("security.key"), HasSubstr("client.key"),
                    HasSubstr("does not match")));
}

// Off loopback the server binary wants TLS and a token. 192.0.2.1 (TEST-NET)
// is not this machine's, so even a server that failed to refuse would not
// listen there.
TEST_F(SecuredClusterTest, TheServerRefusesANonLoopbackAddressWithoutTlsAndToken) {
  const fs::path config = root_ / "plain.textproto";
  std::ofstream(config) << kJob;
  absl::StatusOr<ChildProcess> server =
      ChildProcess::Start("server", {CSERPS_SERVER_BIN, "--config=" + config.string(),
                                     "--listen=192.0.2.1:7000"},
                          {});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string output = ReadOutput(*server, "");
  int wait_status = 0;
  if (server->output_fd() >= 0) server->Signal(SIGKILL);
  ASSERT_EQ(waitpid(server->pid(), &wait_status, 0), server->pid());
  server->SetExited(wait_status);
  EXPECT_EQ(server->exit_code(), 2) << output;
  EXPECT_THAT(output, AllOf(HasSubstr("refusing to listen on 192.0.2.1:7000"),
                            HasSubstr("without TLS and a token"), HasSubstr("--insecure")));
}

// Debian's gRPC never accepts again on a port where accept() once ran out
// of file descriptors, so the server binary raises its soft limit to the
// hard one before it listens.
TEST_F(SecuredClusterTest, TheServerRaisesItsOpenFileLimitToTheHardLimit) {
  const fs::path config = root_ / "files.textproto";
  std::ofstream(config) << kJob;
  absl::StatusOr<ChildProcess> server =
      ChildProcess::Start("server",
                          {"/usr/bin/prlimit", "--nofile=64:4096", CSERPS_SERVER_BIN,
                           "--config=" + config.string()},
                          {});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string output = ReadOutput(*server, "listening on");
  std::ifstream limits(absl::StrCat("/proc/", server->pid(), "/limits"));
  std::string soft;
  for (std::string line; std::getline(limits, line);) {
    std::smatch m;
    if (std::regex_search(line, m, std::regex("^Max open files +([0-9]+) +([0-9]+)"))) soft = m[1];
  }
  server->Signal(SIGTERM);
  int wait_status = 0;
  ASSERT_EQ(waitpid(server->pid(), &wait_status, 0), server->pid());
  server->SetExited(wait_status);
  ASSERT_THAT(output, HasSubstr("listening on"));
  EXPECT_EQ(soft, "4096") << output;
  EXPECT_THAT(output, HasSubstr("open-file limit 4096"));
  EXPECT_EQ(server->exit_code(), 0) << output;
}

}  // namespace
}  // namespace cserps
