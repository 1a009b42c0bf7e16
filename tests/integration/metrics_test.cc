// Prometheus metrics end to end: a server shard exporting to a real HTTP
// /metrics endpoint, scraped with a plain socket after rounds that the test
// counts itself; bad metrics addresses are statuses, not exceptions; worker
// traffic counters follow PsClient's cumulative totals.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/testing/in_process_cluster.h"
#include "worker/ps_client.h"

namespace cserps {
namespace {

using Labels = std::map<std::string, std::string>;

// GET http://127.0.0.1:port/metrics; the body, or the error in a string that
// fails the caller's checks.
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket failed";
  timeval timeout{.tv_sec = 5, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "send failed";
  }
  std::string response;
  char buffer[4096];
  // Bounded: the server closes the connection, or the receive timeout ends
  // a read with -1.
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (response.rfind("HTTP/1.1 200", 0) != 0 && response.rfind("HTTP/1.0 200", 0) != 0) {
    return absl::StrCat("not a 200 response: ", response.substr(0, 200));
  }
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample `name`{labels} in exposition `text`, if present.
std::optional<double> Sample(const std::string& text, const std::string& name,
                             const Labels& labels) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t close = line.find('}');
    if (close == std::string::npos) continue;
    Labels found;
    const std::string inside = line.substr(name.size() + 1, close - name.size() - 1);
    for (absl::string_view pair : absl::StrSplit(inside, ',', absl::SkipEmpty())) {
      std::vector<std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
      if (kv.size() != 2 || kv[1].size() < 2) continue;
      found[kv[0]] = kv[1].substr(1, kv[1].size() - 2);
    }
    if (found != labels) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(close + 1), &value)) return value;
  }
  return std::nullopt;
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

TEST(MetricsTest, ServerExportsItsRoundsAndTrafficOverHttp) {
  absl::StatusOr<std::unique_ptr<MetricsRegistry>> metrics =
      MetricsRegistry::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const int port = PortOf((*metrics)->address());
  ASSERT_GT(port, 0) << (*metrics)->address();

  v1::JobConfig config = testing::TestConfig(R"pb(
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 10 }
    model { kind: SOFTMAX input_dim: 4 num_classes: 2 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" block_size: 4 }
    epochs: 1
  )pb");
  constexpr uint64_t kParams = 10;  // 4 * 2 weights + 2 biases
  absl::StatusOr<std::unique_ptr<PsServer>> server =
      PsServer::Start(config, 0, "127.0.0.1:0", {}, metrics->get());
  ASSERT_TRUE(server.ok()) << server.status();
  config.mutable_cluster()->set_servers(0, (*server)->address());

  std::vector<std::unique_ptr<PsClient>> clients;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(config, kParams);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<uint32_t> rank = (*client)->Register(r, absl::StrCat("metrics-test-", r));
    ASSERT_TRUE(rank.ok()) << rank.status();
    clients.push_back(*std::move(client));
  }
  ASSERT_TRUE(clients[0]->PushModel(std::vector<float>(kParams, 0.5f)).ok());

  // Before any round: registered members counted, nothing completed.
  std::string text = Scrape(port);
  EXPECT_EQ(Sample(text, "cserps_server_members_registered", {{"shard", "0"}}), 2.0) << text;
  EXPECT_EQ(Sample(text, "cserps_server_rounds_completed_total", {{"shard", "0"}}), 0.0) << text;

  // Steps 0..kRounds-1 of GRAD, each one chunk on the one shard: one round
  // per step.
  constexpr int kRounds = 3;
  for (int step = 0; step < kRounds; ++step) {
    absl::Status status[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        std::vector<float> g(kParams, static_cast<float>(r + 1));
        std::vector<float> mean(kParams);
        status[r] = clients[r]->AverageBlocks(v1::GRAD, step, 1, g, 1.0f, 0.1f,
                                              absl::MakeSpan(mean));
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(status[0].ok()) << "step " << step << ": " << status[0];
    ASSERT_TRUE(status[1].ok()) << "step " << step << ": " << status[1];
  }

  text = Scrape(port);
  EXPECT_EQ(Sample(text, "cserps_server_rounds_completed_total", {{"shard", "0"}}),
            double{kRounds})
      << text;
  EXPECT_EQ(Sample(text, "cserps_server_rounds_failed_total", {{"shard", "0"}}), 0.0) << text;
  EXPECT_EQ(Sample(text, "cserps_server_open_rounds", {{"shard", "0"}}), 0.0) << text;
  EXPECT_EQ(Sample(text, "cserps_server_model_step", {{"shard", "0"}}), double{kRounds - 1})
      << text;
  EXPECT_EQ(Sample(text, "cserps_server_round_latency_seconds_count",
                   {{"shard", "0"}, {"stream", "GRAD"}}),
            double{kRounds})
      << text;
  EXPECT_EQ(Sample(text, "cserps_server_round_latency_seconds_count",
                   {{"shard", "0"}, {"stream", "MODEL"}}),
            0.0)
      << text;
  // GRAD carried every PushPull; the model push is "other".
  EXPECT_GT(Sample(text, "cserps_server_bytes_in_total", {{"shard", "0"}, {"stream", "GRAD"}})
                .value_or(0),
            0.0)
      << text;
  EXPECT_GT(Sample(text, "cserps_server_bytes_out_total", {{"shard", "0"}, {"stream", "GRAD"}})
                .value_or(0),
            0.0)
      << text;
  EXPECT_GT(Sample(text, "cserps_server_bytes_in_total", {{"shard", "0"}, {"stream", "other"}})
                .value_or(0),
            0.0)
      << text;
  EXPECT_EQ(Sample(text, "cserps_server_bytes_in_total", {{"shard", "0"}, {"stream", "MODEL"}}),
            0.0)
      << text;

  clients.clear();
  (*server)->Shutdown();
  server->reset();
  // The server is gone: its series are no longer collected, and the scrape
  // still works.
  text = Scrape(port);
  EXPECT_FALSE(Sample(text, "cserps_server_rounds_completed_total", {{"shard", "0"}}).has_value())
      << text;
}

TEST(MetricsTest, BadAddressesAreStatusesNamingTheAddress) {
  absl::StatusOr<std::unique_ptr<MetricsRegistry>> no_port =
      MetricsRegistry::Start("localhost");
  EXPECT_EQ(no_port.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_port.status().message().find("localhost"), std::string::npos)
      << no_port.status();

  absl::StatusOr<std::unique_ptr<MetricsRegistry>> first =
      MetricsRegistry::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->address();
  absl::StatusOr<std::unique_ptr<MetricsRegistry>> second = MetricsRegistry::Start(taken);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(taken), std::string::npos) << second.status();
}

TEST(MetricsTest, BadMetricNamesAreStatuses) {
  std::unique_ptr<MetricsRegistry> metrics = MetricsRegistry::WithoutEndpoint();
  absl::StatusOr<prometheus::Counter*> bad = metrics->Counter("bad name!", "help", {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad name!"), std::string::npos) << bad.status();
  // One name, two types.
  ASSERT_TRUE(metrics->Counter("cserps_test_things_total", "help", {}).ok());
  EXPECT_FALSE(metrics->Gauge("cserps_test_things_total", "help", {}).ok());
}

TEST(MetricsTest, WorkerMetricsFollowCumulativeTotals) {
  std::unique_ptr<MetricsRegistry> metrics = MetricsRegistry::WithoutEndpoint();
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> worker =
      WorkerMetrics::Create(metrics.get(), 3, "cser");
  ASSERT_TRUE(worker.ok()) << worker.status();
  (*worker)->SetTraffic("GRAD", 100, 40);
  (*worker)->SetTraffic("GRAD", 250, 40);
  (*worker)->SetTraffic("MODEL", 7, 9);
  (*worker)->RecordStep(absl::Milliseconds(30), absl::Milliseconds(6), absl::Milliseconds(4),
                        8, 1.5, 0.05);
  (*worker)->RecordStep(absl::Milliseconds(60), absl::Milliseconds(12), absl::Milliseconds(8),
                        8, 1.25, 0.025);
  (*worker)->SetTestAccuracy(/*global=*/true, 0.75);

  const std::string text = metrics->Collect();
  const Labels base = {{"rank", "3"}, {"algorithm", "cser"}};
  auto with = [&base](const std::string& key, const std::string& value) {
    Labels l = base;
    l[key] = value;
    return l;
  };
  EXPECT_EQ(Sample(text, "cserps_worker_bytes_pushed_total", with("stream", "GRAD")), 250.0)
      << text;
  EXPECT_EQ(Sample(text, "cserps_worker_bytes_pulled_total", with("stream", "GRAD")), 40.0)
      << text;
  EXPECT_EQ(Sample(text, "cserps_worker_bytes_pushed_total", with("stream", "MODEL")), 7.0)
      << text;
  EXPECT_EQ(Sample(text, "cserps_worker_steps_total", base), 2.0) << text;
  // The last step: 8 examples in 80 ms.
  EXPECT_NEAR(Sample(text, "cserps_worker_samples_per_second", base).value_or(0), 100.0, 1e-6)
      << text;
  EXPECT_EQ(Sample(text, "cserps_worker_train_loss", base), 1.25) << text;
  EXPECT_EQ(Sample(text, "cserps_worker_learning_rate", base), 0.025) << text;
  EXPECT_EQ(Sample(text, "cserps_worker_step_seconds_count", with("phase", "compute")), 2.0)
      << text;
  EXPECT_NEAR(Sample(text, "cserps_worker_step_seconds_sum", with("phase", "compute")).value_or(0),
              0.09, 1e-9)
      << text;
  EXPECT_NEAR(
      Sample(text, "cserps_worker_step_seconds_sum", with("phase", "communication")).value_or(0),
      0.018, 1e-9)
      << text;
  EXPECT_NEAR(Sample(text, "cserps_worker_step_seconds_sum", with("phase", "update")).value_or(0),
              0.012, 1e-9)
      << text;
  EXPECT_EQ(Sample(text, "cserps_worker_test_accuracy", with("model", "global")), 0.75) << text;
}

}  // namespace
}  // namespace cserps
