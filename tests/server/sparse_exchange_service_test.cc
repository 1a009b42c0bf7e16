// The SparseExchange service over real gRPC: shard 0 of a two-shard job runs
// in-process; the test registers three ranks and pushes through the stubs.
#include "server/sparse_exchange_service.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/algorithm_catalog.h"
#include "common/block_layout.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "server/shard_context.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kWorkers = 3;

v1::JobConfig Config(const std::string& algorithm, uint32_t max_message_bytes = 4u << 20,
                     const std::string& model = "kind: SOFTMAX input_dim: 199 num_classes: 10") {
  v1::JobConfig config = *ParseJobConfig(
      absl::StrCat(
          "name: \"sparse-test\" seed: 3 epochs: 1\n",
          "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" num_workers: ",
          kWorkers, " round_timeout_s: 10 max_message_bytes: ", max_message_bytes, " }\n",
          "model { ", model, " }\n",
          "data { batch_size: 4 }\n",
          "optimizer { lr: 0.1 }\n",
          "algorithm { block_size: 32 ", algorithm, " }\n"),
      "test");
  ApplyDefaults(&config);
  return config;
}

std::string U32Bytes(const std::vector<uint32_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string F32Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::vector<float> Floats(const std::string& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}
std::vector<uint32_t> U32s(const std::string& b) {
  std::vector<uint32_t> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

class SparseServiceTest : public ::testing::Test {
 protected:
  void Start(const v1::JobConfig& config) {
    config_ = config;
    absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(config_, 0, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    ps_ = v1::ParameterServer::NewStub(channel);
    sparse_ = v1::SparseExchange::NewStub(channel);
    const uint64_t d = MakeModelSpec(config_.model())->num_params;
    layout_ = std::make_unique<BlockLayout>(d, config_.algorithm().block_size(), 2);
    first_ = layout_->ShardFirstFloat(0);
    end_ = layout_->ShardEndFloat(0);
    k_s_ = ShardSparseK(SparseK(config_.algorithm(), d), end_ - first_, d);
    for (uint32_t r = 0; r < kWorkers; ++r) {
      v1::RegisterRequest request;
      *request.mutable_config() = config_;
      request.set_requested_rank(static_cast<int>(r));
      request.set_worker_id(absl::StrCat("w", r));
      v1::RegisterResponse response;
      grpc::ClientContext context;
      ASSERT_TRUE(ps_->Register(&context, request, &response).ok());
    }
    // The initial model: x0[j] = j / 1000 on this shard.
    x0_.resize(end_ - first_);
    for (size_t j = 0; j < x0_.size(); ++j) x0_[j] = static_cast<float>(first_ + j) / 1000.0f;
    v1::PushModelRequest push;
    push.set_fingerprint(JobFingerprint(config_));
    push.set_rank(0);
    push.set_offset(first_);
    push.set_values(F32Bytes(x0_));
    v1::PushModelResponse pushed;
    grpc::ClientContext context;
    ASSERT_TRUE(ps_->PushModel(&context, push, &pushed).ok());
  }

  v1::SparsePushPullRequest Request(uint32_t rank, uint64_t step,
                                    const std::vector<uint32_t>& indices,
                                    const std::vector<float>& values) {
    v1::SparsePushPullRequest r;
    r.set_fingerprint(JobFingerprint(config_));
    r.set_rank(rank);
    r.set_step(step);
    r.set_k(k_s_);
    r.set_indices(U32Bytes(indices));
    r.set_values(F32Bytes(values));
    return r;
  }

  // Starts a push; `done` is notified with its status.
  struct Call {
    grpc::ClientContext context;
    v1::SparsePushPullRequest request;
    v1::SparsePushPullResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::unique_ptr<Call> StartPush(v1::SparsePushPullRequest request) {
    auto call = std::make_unique<Call>();
    call->request = std::move(request);
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    Call* c = call.get();
    sparse_->async()->SparsePushPull(&c->context, &c->request, &c->response,
                                     [c](grpc::Status s) {
                                       c->status = std::move(s);
                                       c->done.Notify();
                                     });
    return call;
  }
  grpc::Status PushSync(const v1::SparsePushPullRequest& request,
                        v1::SparsePushPullResponse* response) {
    grpc::ClientContext context;
    return sparse_->SparsePushPull(&context, request, response);
  }

  std::vector<float> PullShard() {
    v1::PullModelRequest request;
    request.set_fingerprint(JobFingerprint(config_));
    request.set_offset(first_);
    request.set_count(end_ - first_);
    v1::PullModelResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(ps_->PullModel(&context, request, &response).ok());
    return Floats(response.values());
  }

  // k_s distinct random indices of the shard with values on a coarse grid.
  std::pair<std::vector<uint32_t>, std::vector<float>> RandomEntries(std::mt19937& rng) {
    std::vector<uint32_t> all(end_ - first_);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint32_t>(first_) + i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(k_s_);
    std::sort(all.begin(), all.end());
    std::uniform_int_distribution<int> grid(-6, 6);
    std::vector<float> values;
    for (size_t i = 0; i < all.size(); ++i) values.push_back(0.5f * grid(rng));
    return {all, values};
  }

  // Runs one full round of step `step` with random pushes and checks every
  // answer and the model against an independent reference.
  void RunRoundAndCheck(uint64_t step, std::mt19937& rng, bool global_topk) {
    const std::vector<float> before = PullShard();
    std::vector<double> sum(end_ - first_, 0.0);
    std::vector<bool> touched(end_ - first_, false);
    std::vector<std::unique_ptr<Call>> calls;
    for (uint32_t r = 0; r < kWorkers; ++r) {
      auto [indices, values] = RandomEntries(rng);
      for (size_t i = 0; i < indices.size(); ++i) {
        sum[indices[i] - first_] += values[i];
        touched[indices[i] - first_] = true;
      }
      calls.push_back(StartPush(Request(r, step, indices, values)));
    }
    std::vector<std::pair<float, uint32_t>> ranked;
    for (uint32_t j = 0; j < sum.size(); ++j) {
      if (touched[j]) ranked.push_back({-std::fabs(static_cast<float>(sum[j])), j});
    }
    std::sort(ranked.begin(), ranked.end());
    if (global_topk && ranked.size() > k_s_) ranked.resize(k_s_);
    std::vector<uint32_t> want;
    for (const auto& [m, j] : ranked) want.push_back(j);
    std::sort(want.begin(), want.end());
    std::vector<uint32_t> want_indices;
    std::vector<float> want_values;
    std::vector<float> after = before;
    for (uint32_t j : want) {
      want_indices.push_back(static_cast<uint32_t>(first_) + j);
      want_values.push_back(static_cast<float>(sum[j]));
      after[j] = before[j] - static_cast<float>(sum[j]) / static_cast<float>(kWorkers);
    }
    for (auto& call : calls) {
      call->done.WaitForNotification();
      ASSERT_TRUE(call->status.ok()) << call->status.error_message();
      EXPECT_EQ(call->response.step(), step);
      EXPECT_EQ(U32s(call->response.indices()), want_indices);
      EXPECT_EQ(Floats(call->response.values()), want_values);
      EXPECT_EQ(call->response.indices(), calls[0]->response.indices());
      EXPECT_EQ(call->response.values(), calls[0]->response.values());
    }
    EXPECT_EQ(PullShard(), after);
  }

  v1::JobConfig config_;
  std::unique_ptr<PsServer> server_;
  std::unique_ptr<v1::ParameterServer::Stub> ps_;
  std::unique_ptr<v1::SparseExchange::Stub> sparse_;
  std::unique_ptr<BlockLayout> layout_;
  uint64_t first_ = 0, end_ = 0, k_s_ = 0;
  std::vector<float> x0_;
};

TEST_F(SparseServiceTest, GlobalTopKRoundsMatchReferenceAndUpdateTheModel) {
  // d = 2000, 63 blocks, shard 0 = 32 blocks = [0, 1024); k = 100, k_s = 51.
  Start(Config("name: \"gtopk-ssgd\" density: 0.05"));
  ASSERT_EQ(k_s_, 51u);
  std::mt19937 rng(7);
  for (uint64_t step = 0; step < 6; ++step) RunRoundAndCheck(step, rng, true);
}

TEST_F(SparseServiceTest, TopKRoundsReturnTheUnion) {
  Start(Config("name: \"topk-ssgd\" density: 0.05"));
  std::mt19937 rng(8);
  for (uint64_t step = 0; step < 4; ++step) RunRoundAndCheck(step, rng, false);
}

TEST_F(SparseServiceTest, RetryIsAnsweredWithTheSameBytesAndNotCountedTwice) {
  Start(Config("name: \"gtopk-ssgd\" density: 0.05"));
  std::mt19937 rng(9);
  RunRoundAndCheck(0, rng, true);
  const std::vector<float> model = PullShard();
  auto [indices, values] = RandomEntries(rng);
  v1::SparsePushPullResponse retry;
  ASSERT_TRUE(PushSync(Request(1, 0, indices, values), &retry).ok());
  EXPECT_EQ(U32s(retry.indices()).size(), k_s_);
  EXPECT_EQ(PullShard(), model);  // the retry changed nothing
}

// As the dense rounds': every push is counted before any member is
// answered, here inside the push that completes the round.
TEST_F(SparseServiceTest, ARoundsPushesAreCountedBeforeItsMembersAreAnswered) {
  Start(Config("name: \"gtopk-ssgd\" density: 0.05"));
  SparseExchangeService& service = server_->sparse_service();
  const uint64_t before = service.counters().traffic.request_bytes;
  std::mt19937 rng(10);
  constexpr uint64_t kRequestBytes = 100;
  std::vector<uint64_t> seen;
  for (uint32_t r = 0; r < kWorkers; ++r) {
    auto [indices, values] = RandomEntries(rng);
    service.Push({JobFingerprint(config_), r, 0, k_s_},
                 {std::move(indices), std::move(values)}, kRequestBytes, 0,
                 [&](absl::StatusOr<SparseRoundReply> reply) {
                   EXPECT_TRUE(reply.ok()) << reply.status();
                   seen.push_back(service.counters().traffic.request_bytes - before);
                 });
  }
  EXPECT_EQ(seen, std::vector<uint64_t>(kWorkers, kWorkers * kRequestBytes));
}

TEST_F(SparseServiceTest, RefusesBadInputAndKeepsServing) {
  Start(Config("name: \"gtopk-ssgd\" density: 0.05"));
  std::mt19937 rng(10);
  auto [good_i, good_v] = RandomEntries(rng);
  struct Case {
    v1::SparsePushPullRequest request;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](v1::SparsePushPullRequest r, grpc::StatusCode code, std::string m) {
    cases.push_back({std::move(r), code, std::move(m)});
  };
  {
    auto i = good_i;
    i.back() = static_cast<uint32_t>(end_);
    add(Request(0, 0, i, good_v), grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("index ", end_, " at position ", k_s_ - 1));
  }
  {
    auto i = good_i;
    std::swap(i[3], i[4]);
    add(Request(0, 0, i, good_v), grpc::StatusCode::INVALID_ARGUMENT,
        "at position 4 (byte offset 16) is below");
  }
  {
    auto i = good_i;
    i[5] = i[4];
    add(Request(0, 0, i, good_v), grpc::StatusCode::INVALID_ARGUMENT,
        "at position 5 (byte offset 20) repeats");
  }
  {
    auto v = good_v;
    v.pop_back();
    add(Request(0, 0, good_i, v), grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("indices has ", k_s_, " entries but values has ", k_s_ - 1));
  }
  {
    auto r = Request(0, 0, good_i, good_v);
    r.mutable_indices()->push_back('\0');
    add(r, grpc::StatusCode::INVALID_ARGUMENT, "not a whole number of uint32");
  }
  {
    auto r = Request(0, 0, good_i, good_v);
    r.set_k(k_s_ + 1);
    add(r, grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("k ", k_s_ + 1, " is not this shard's k_s ", k_s_));
  }
  {
    auto r = Request(0, 0, good_i, good_v);
    r.set_fingerprint(r.fingerprint() + 1);
    add(r, grpc::StatusCode::FAILED_PRECONDITION, "fingerprint");
  }
  add(Request(kWorkers, 0, good_i, good_v), grpc::StatusCode::INVALID_ARGUMENT,
      "rank 3 is out of range");
  for (const Case& c : cases) {
    v1::SparsePushPullResponse response;
    const grpc::Status status = PushSync(c.request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.message << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
    EXPECT_THAT(status.error_message(), HasSubstr("SparsePushPull (step 0)"));
  }
  // Nothing was counted: a full round still completes as the reference says.
  EXPECT_EQ(PullShard(), x0_);
  RunRoundAndCheck(0, rng, true);
}

TEST_F(SparseServiceTest, OtherAlgorithmsAreRefused) {
  Start(Config("name: \"ssgd\""));
  v1::SparsePushPullRequest r = Request(0, 0, {1, 2}, {1, 2});
  v1::SparsePushPullResponse response;
  const grpc::Status status = PushSync(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("ssgd does not use the sparse exchange"));
}

// Its own server, so that the test knows the push reached the handler (the
// injected clock is read there) before the service shuts down: parked or
// not yet in the table, the push must get UNAVAILABLE.
TEST(SparseServiceShutdownTest, AnswersParkedCallsUnavailable) {
  const v1::JobConfig config = Config("name: \"gtopk-ssgd\" density: 0.05");
  absl::StatusOr<std::unique_ptr<ShardContext>> shard = ShardContext::Create(config, 0);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE((*shard)->members().Register(0, "w0").ok());
  absl::Notification reached;
  SparseExchangeService::Options options;
  options.expiry_thread = false;
  options.now = [&reached] {
    if (!reached.HasBeenNotified()) reached.Notify();
    return absl::Now();
  };
  absl::StatusOr<std::unique_ptr<SparseExchangeService>> service =
      SparseExchangeService::Create(shard->get(), options);
  ASSERT_TRUE(service.ok()) << service.status();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service->get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto stub = v1::SparseExchange::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  const uint64_t k_s = (*service)->shard_k();
  std::vector<uint32_t> indices(k_s);
  for (uint32_t i = 0; i < k_s; ++i) indices[i] = i;
  v1::SparsePushPullRequest request;
  request.set_fingerprint(JobFingerprint(config));
  request.set_rank(0);
  request.set_step(0);
  request.set_k(k_s);
  request.set_indices(U32Bytes(indices));
  request.set_values(F32Bytes(std::vector<float>(k_s, 1.0f)));
  v1::SparsePushPullResponse response;
  grpc::ClientContext context;
  grpc::Status status;
  absl::Notification done;
  stub->async()->SparsePushPull(&context, &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  reached.WaitForNotification();
  (*service)->Shutdown();
  done.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("shutting down"));
  server->Shutdown();
}

TEST(SparseServiceCreateTest, RefusesAJobWhoseRepliesWouldNotFitAMessage) {
  // d = 79510, shard 0 owns 39776 floats; 64 KiB messages hold 8064 entries.
  // topk-ssgd replies with up to 3 * k_s = 3 * 1989 entries at density
  // 0.05, which fits; at density 0.2 (k_s = 7955) it does not, gtopk-ssgd does.
  const std::string mlp = "kind: MLP input_dim: 784 hidden: 100 num_classes: 10";
  EXPECT_TRUE(PsServer::Start(Config("name: \"topk-ssgd\" density: 0.05", 64 * 1024, mlp),
                              0, "127.0.0.1:0").ok());
  EXPECT_TRUE(PsServer::Start(Config("name: \"gtopk-ssgd\" density: 0.2", 64 * 1024, mlp),
                              0, "127.0.0.1:0").ok());
  const absl::StatusOr<std::unique_ptr<PsServer>> refused =
      PsServer::Start(Config("name: \"topk-ssgd\" density: 0.2", 64 * 1024, mlp), 0,
                      "127.0.0.1:0");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("cluster.max_message_bytes: 65536 bytes hold at most 8064 sparse entries"));
  // A union holds distinct floats of the shard: 3 * k_s is past the limit
  // at density 0.9 of a shard of 8000 floats, the shard's size is not.
  const absl::StatusOr<std::unique_ptr<PsServer>> small =
      PsServer::Start(Config("name: \"topk-ssgd\" density: 0.9", 64 * 1024,
                             "kind: FLAT num_params: 16000"),
                      0, "127.0.0.1:0");
  EXPECT_TRUE(small.ok()) << small.status();
}

// Only the jobs of the sparse exchange keep servers' momentum on it: the
// shard of any other job holds none (shard-sized buffers nothing reads).
TEST(SparseServiceCreateTest, OnlySparseJobsKeepServersMomentum) {
  for (const bool sparse : {false, true}) {
    SCOPED_TRACE(sparse ? "gtopk-ssgd" : "ssgd");
    v1::JobConfig config =
        Config(sparse ? "name: \"gtopk-ssgd\" density: 0.05" : "name: \"ssgd\"");
    config.mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::HEAVY_BALL);
    config.mutable_optimizer()->set_momentum(0.9f);
    absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(config, 0, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->sparse_service().MomentumForCheckpoint().size(),
              sparse ? (*server)->shard().store().size() : 0u);
  }
}

}  // namespace
}  // namespace cserps
