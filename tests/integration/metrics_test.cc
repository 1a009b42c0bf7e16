// Prometheus metrics end to end: a server shard exporting to a real HTTP
// /metrics endpoint, scraped with a plain socket after rounds that the test
// counts itself; the sparse exchange and asynchronous SGD counted under
// their own streams with the bytes of the requests the test sent; members
// alive following a fake clock; bad metrics addresses are statuses, not
// exceptions; worker traffic counters follow PsClient's cumulative totals.
#include <arpa/inet.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
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
#include "absl/synchronization/notification.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/metrics.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/ps/ps_client.h"

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
  EXPECT_EQ(Sample(text, "cserps_server_rounds_completed_total",
                   {{"shard", "0"}, {"stream", "GRAD"}}),
            0.0)
      << text;

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
  EXPECT_EQ(Sample(text, "cserps_server_rounds_completed_total",
                   {{"shard", "0"}, {"stream", "GRAD"}}),
            double{kRounds})
      << text;
  // Every stream has its series from the start, zero when unused.
  for (const char* stream : {"MODEL", "CHECKPOINT", "sparse", "async"}) {
    EXPECT_EQ(Sample(text, "cserps_server_rounds_completed_total",
                     {{"shard", "0"}, {"stream", stream}}),
              0.0)
        << stream << "\n" << text;
  }
  for (const char* stream : {"GRAD", "MODEL", "CHECKPOINT", "sparse", "async"}) {
    EXPECT_EQ(Sample(text, "cserps_server_rounds_failed_total",
                     {{"shard", "0"}, {"stream", stream}}),
              0.0)
        << stream << "\n" << text;
  }
  EXPECT_EQ(Sample(text, "cserps_server_open_rounds", {{"shard", "0"}}), 0.0) << text;
  EXPECT_EQ(Sample(text, "cserps_server_members_dropped_total", {{"shard", "0"}}), 0.0) << text;
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
  EXPECT_FALSE(Sample(text, "cserps_server_rounds_completed_total",
                      {{"shard", "0"}, {"stream", "GRAD"}})
                   .has_value())
      << text;
}

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}
std::string FloatBytes(const std::vector<float>& v) {
  return Bytes(v.data(), v.size() * sizeof(float));
}
std::string IndexBytes(const std::vector<uint32_t>& v) {
  return Bytes(v.data(), v.size() * sizeof(uint32_t));
}

template <typename Context>
void SetDeadline(Context* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
}

// One shard of a one-shard job run in-process with its metrics in a
// registry without endpoint (Collect is what a scrape returns), driven
// through the raw stubs so that the test knows every request's size.
class RawShard {
 public:
  // `now`: the server's clock (nullptr: the real one).
  RawShard(const std::string& config_text, std::function<absl::Time()> now = nullptr)
      : config_(testing::TestConfig(config_text)),
        metrics_(MetricsRegistry::WithoutEndpoint()) {
    ParameterServerService::Options options;
    if (now) {
      options.now = std::move(now);
      // Time moves only when the test says so; no round may time out.
      options.expiry_thread = false;
    }
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        PsServer::Start(config_, 0, "127.0.0.1:0", std::move(options), metrics_.get());
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    auto channel =
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    ps_ = v1::ParameterServer::NewStub(channel);
    sparse_ = v1::SparseExchange::NewStub(channel);
    async_ = v1::AsyncParameterServer::NewStub(channel);
  }
  ~RawShard() {
    if (server_ != nullptr) server_->Shutdown();
  }

  bool started() const { return server_ != nullptr; }
  const v1::JobConfig& config() const { return config_; }
  uint64_t fingerprint() const { return JobFingerprint(config_); }
  PsServer& server() { return *server_; }
  v1::ParameterServer::Stub& ps() { return *ps_; }
  v1::SparseExchange::Stub& sparse() { return *sparse_; }
  v1::AsyncParameterServer::Stub& async() { return *async_; }
  std::string Scrape() const { return metrics_->Collect(); }

  grpc::Status Register(uint32_t rank) {
    v1::RegisterRequest request;
    *request.mutable_config() = config_;
    request.set_requested_rank(static_cast<int32_t>(rank));
    request.set_worker_id(absl::StrCat("metrics-test-", rank));
    v1::RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return ps_->Register(&context, request, &response);
  }

  // Writes `values` from float 0 as rank `rank`; the request's size.
  uint64_t PushModel(uint32_t rank, const std::vector<float>& values) {
    v1::PushModelRequest request;
    request.set_fingerprint(fingerprint());
    request.set_rank(rank);
    request.set_offset(0);
    request.set_values(FloatBytes(values));
    v1::PushModelResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status status = ps_->PushModel(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return request.ByteSizeLong();
  }

 private:
  const v1::JobConfig config_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<PsServer> server_;
  std::unique_ptr<v1::ParameterServer::Stub> ps_;
  std::unique_ptr<v1::SparseExchange::Stub> sparse_;
  std::unique_ptr<v1::AsyncParameterServer::Stub> async_;
};

// A unary call started on the stub's async API; `done` is notified when it
// is answered.
template <typename Request, typename Response>
struct PendingCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  grpc::Status status;
  absl::Notification done;
};

double Value(const std::string& text, const std::string& name, const Labels& labels) {
  const std::optional<double> v = Sample(text, name, labels);
  EXPECT_TRUE(v.has_value()) << name << " " << ::testing::PrintToString(labels) << "\n"
                             << text;
  return v.value_or(-1);
}

Labels ShardStream(const std::string& stream) {
  return {{"shard", "0"}, {"stream", stream}};
}

TEST(MetricsTest, SparseExchangeIsCountedAsStreamSparse) {
  // d = 20 * 5 + 5 = 105 floats, all on the one shard.
  RawShard shard(R"pb(
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 10 }
    model { kind: SOFTMAX input_dim: 20 num_classes: 5 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "gtopk-ssgd" block_size: 8 density: 0.1 }
    epochs: 1
  )pb");
  ASSERT_TRUE(shard.started());
  constexpr uint64_t kD = 105;
  const uint64_t k_s = ShardSparseK(SparseK(shard.config().algorithm(), kD), kD, kD);
  ASSERT_GT(k_s, 1u);
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(shard.Register(r).ok());
  uint64_t other_in = shard.PushModel(0, std::vector<float>(kD, 0.5f));

  auto push = [&](uint32_t rank, uint64_t k, uint32_t first_index) {
    auto call = std::make_unique<
        PendingCall<v1::SparsePushPullRequest, v1::SparsePushPullResponse>>();
    call->request.set_fingerprint(shard.fingerprint());
    call->request.set_rank(rank);
    call->request.set_step(3);
    call->request.set_k(k);
    std::vector<uint32_t> indices(k_s);
    std::vector<float> values(k_s);
    for (uint32_t i = 0; i < k_s; ++i) {
      indices[i] = first_index + i;
      values[i] = static_cast<float>(rank + 1) * (i + 1);
    }
    call->request.set_indices(IndexBytes(indices));
    call->request.set_values(FloatBytes(values));
    SetDeadline(&call->context);
    auto* c = call.get();
    shard.sparse().async()->SparsePushPull(&c->context, &c->request, &c->response,
                                           [c](grpc::Status status) {
                                             c->status = std::move(status);
                                             c->done.Notify();
                                           });
    return call;
  };
  // Refused (k is not k_s): counted as "other", no round.
  auto refused = push(0, k_s + 1, 0);
  refused->done.WaitForNotification();
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << refused->status.error_message();
  other_in += refused->request.ByteSizeLong();

  auto first = push(0, k_s, 0);
  auto second = push(1, k_s, 1);
  first->done.WaitForNotification();
  second->done.WaitForNotification();
  ASSERT_TRUE(first->status.ok()) << first->status.error_message();
  ASSERT_TRUE(second->status.ok()) << second->status.error_message();

  const std::string text = shard.Scrape();
  EXPECT_EQ(Value(text, "cserps_server_rounds_completed_total", ShardStream("sparse")), 1.0);
  EXPECT_EQ(Value(text, "cserps_server_rounds_failed_total", ShardStream("sparse")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_rounds_completed_total", ShardStream("GRAD")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("sparse")),
            double(first->request.ByteSizeLong() + second->request.ByteSizeLong()));
  EXPECT_EQ(Value(text, "cserps_server_bytes_out_total", ShardStream("sparse")),
            double(first->response.ByteSizeLong() + second->response.ByteSizeLong()));
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("other")),
            double(other_in));
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("GRAD")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_round_latency_seconds_count", ShardStream("sparse")),
            1.0);
  EXPECT_EQ(Value(text, "cserps_server_model_step", {{"shard", "0"}}), 3.0);
  EXPECT_EQ(Value(text, "cserps_server_open_rounds", {{"shard", "0"}}), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_members_alive", {{"shard", "0"}}), 2.0);
}

TEST(MetricsTest, AsyncPushesAreCountedAsStreamAsync) {
  RawShard shard(R"pb(
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 10 }
    model { kind: SOFTMAX input_dim: 20 num_classes: 5 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "async-sgd" block_size: 8 staleness: 0 }
    epochs: 1
  )pb");
  ASSERT_TRUE(shard.started());
  constexpr uint64_t kD = 105;
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(shard.Register(r).ok());
  uint64_t other_in = shard.PushModel(0, std::vector<float>(kD, 0.5f));

  uint64_t in = 0;
  uint64_t out = 0;
  // The shard is one chunk: a push is [offset, offset + count).
  auto push = [&](uint32_t rank, uint64_t step, uint64_t offset, uint64_t count) {
    v1::AsyncPushPullRequest request;
    request.set_fingerprint(shard.fingerprint());
    request.set_rank(rank);
    request.set_step(step);
    request.set_offset(offset);
    request.set_lr(0.1f);
    request.set_gradient(FloatBytes(std::vector<float>(count, 1.0f + rank)));
    v1::AsyncPushPullResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status status = shard.async().AsyncPushPull(&context, request, &response);
    if (status.ok()) {
      in += request.ByteSizeLong();
      out += response.ByteSizeLong();
    } else {
      other_in += request.ByteSizeLong();
    }
    return status;
  };
  ASSERT_TRUE(push(0, 0, 0, kD).ok());
  // A retry is answered but not applied again: its bytes count, the push
  // does not.
  ASSERT_TRUE(push(0, 0, 0, kD).ok());
  ASSERT_TRUE(push(1, 5, 0, kD).ok());
  // Floats beyond the model, or not a chunk: refused, "other".
  EXPECT_EQ(push(1, 6, kD - 5, 10).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(push(1, 6, 20, 10).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const std::string text = shard.Scrape();
  EXPECT_EQ(Value(text, "cserps_server_rounds_completed_total", ShardStream("async")), 2.0);
  EXPECT_EQ(Value(text, "cserps_server_rounds_failed_total", ShardStream("async")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_rounds_completed_total", ShardStream("GRAD")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_rounds_completed_total", ShardStream("sparse")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("async")), double(in));
  EXPECT_EQ(Value(text, "cserps_server_bytes_out_total", ShardStream("async")), double(out));
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("other")),
            double(other_in));
  EXPECT_EQ(Value(text, "cserps_server_bytes_in_total", ShardStream("GRAD")), 0.0);
  EXPECT_EQ(Value(text, "cserps_server_model_step", {{"shard", "0"}}), 5.0);
}

TEST(MetricsTest, MembersAliveFollowsSilenceAndComesBack) {
  constexpr int kTimeoutS = 10;
  std::atomic<int64_t> now_s{0};
  RawShard shard(absl::StrCat(R"pb(
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: )pb", kTimeoutS,
                              R"pb( }
    model { kind: SOFTMAX input_dim: 4 num_classes: 2 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" block_size: 4 }
    epochs: 1
  )pb"),
                 [&now_s] { return absl::FromUnixSeconds(1000 + now_s.load()); });
  ASSERT_TRUE(shard.started());
  constexpr uint64_t kParams = 10;
  auto alive = [&shard] {
    return Value(shard.Scrape(), "cserps_server_members_alive", {{"shard", "0"}});
  };
  auto registered = [&shard] {
    return Value(shard.Scrape(), "cserps_server_members_registered", {{"shard", "0"}});
  };
  EXPECT_EQ(alive(), 0.0);

  // t = 0: both register; t = 6: rank 0 writes the model.
  for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(shard.Register(r).ok());
  EXPECT_EQ(alive(), 2.0);
  now_s = 6;
  shard.PushModel(0, std::vector<float>(kParams, 0.5f));
  now_s = kTimeoutS - 1;
  EXPECT_EQ(alive(), 2.0);
  // Rank 1 has been silent for the timeout; registered all the same.
  now_s = kTimeoutS;
  EXPECT_EQ(alive(), 1.0);
  EXPECT_EQ(registered(), 2.0);
  now_s = 6 + kTimeoutS;
  EXPECT_EQ(alive(), 0.0);

  // Rank 1 comes back with a push that waits for rank 0.
  now_s = 20;
  auto push = [&](uint32_t rank) {
    auto call =
        std::make_unique<PendingCall<v1::PushPullRequest, v1::PushPullResponse>>();
    call->request.set_fingerprint(shard.fingerprint());
    call->request.set_rank(rank);
    call->request.set_step(0);
    call->request.set_stream(v1::GRAD);
    call->request.set_ratio(1);
    call->request.set_chunk(0);
    call->request.set_weight(1.0f);
    call->request.set_lr(0.1f);
    call->request.set_values(FloatBytes(std::vector<float>(kParams, 1.0f)));
    SetDeadline(&call->context);
    auto* c = call.get();
    shard.ps().async()->PushPull(&c->context, &c->request, &c->response,
                                 [c](grpc::Status status) {
                                   c->status = std::move(status);
                                   c->done.Notify();
                                 });
    return call;
  };
  auto parked = push(1);
  const absl::Time limit = absl::Now() + absl::Seconds(20);
  while (shard.server().service().counters().open_rounds == 0 && absl::Now() < limit) {
  }
  ASSERT_EQ(shard.server().service().counters().open_rounds, 1u);
  EXPECT_EQ(alive(), 1.0);
  // Waiting on rank 0 is not silence, however long it lasts.
  now_s = 20 + 3 * kTimeoutS;
  EXPECT_EQ(alive(), 1.0);
  EXPECT_FALSE(parked->done.HasBeenNotified());

  // Rank 0 comes back and completes the round: both answered at t = 50.
  auto completing = push(0);
  completing->done.WaitForNotification();
  parked->done.WaitForNotification();
  ASSERT_TRUE(completing->status.ok()) << completing->status.error_message();
  ASSERT_TRUE(parked->status.ok()) << parked->status.error_message();
  EXPECT_EQ(alive(), 2.0);
  now_s = 50 + kTimeoutS - 1;
  EXPECT_EQ(alive(), 2.0);
  now_s = 50 + kTimeoutS;
  EXPECT_EQ(alive(), 0.0);
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
  (*worker)->SetMembers(3);

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
  EXPECT_EQ(Sample(text, "cserps_worker_job_members", base), 3.0) << text;
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
