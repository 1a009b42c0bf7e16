// The AsyncParameterServer service over real gRPC: shard 0 of a two-shard
// job runs in-process on 127.0.0.1:0 next to the dense service (Register,
// PushModel, PullModel), with a fake clock for the liveness rule.
#include "server/async_service.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/block_layout.h"
#include "common/config.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/parameter_server_service.h"
#include "server/shard_context.h"
#include "tests/testing/test_support.h"

namespace cserps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// SOFTMAX 3300 -> 10: d = 33010 floats in blocks of 1024; shard 0 of two owns
// floats [0, 17408), which at 64 KiB messages is two chunks.
constexpr uint64_t kShardEnd = 17 * 1024;
constexpr uint32_t kMaxMessageBytes = 64 * 1024;
constexpr int kTimeoutS = 10;

struct Chunk {
  uint64_t offset;
  uint64_t count;
};

std::vector<Chunk> ShardChunks() {
  const uint64_t per_chunk = ChunkFloats(kMaxMessageBytes);
  std::vector<Chunk> chunks;
  for (uint64_t off = 0; off < kShardEnd; off += per_chunk) {
    chunks.push_back({off, std::min(per_chunk, kShardEnd - off)});
  }
  return chunks;
}

v1::JobConfig MakeConfig(uint32_t world, uint32_t staleness, const std::string& optimizer,
                         const std::string& algorithm) {
  return [&] {
    absl::StatusOr<v1::JobConfig> config = ParseJobConfig(
        absl::StrCat(R"pb(
          name: "async-service-test"
          seed: 7
          cluster {
            servers: "127.0.0.1:0"
            servers: "127.0.0.1:0"
            num_workers: )pb", world, R"pb(
            max_message_bytes: )pb", kMaxMessageBytes, R"pb(
            round_timeout_s: )pb", kTimeoutS, R"pb(
          }
          model { kind: SOFTMAX input_dim: 3300 num_classes: 10 }
          data { batch_size: 8 }
          optimizer { )pb", optimizer, R"pb( }
          algorithm { block_size: 1024 )pb", algorithm, " ",
                     staleness > 0 ? absl::StrCat("staleness: ", staleness) : "", R"pb( }
          epochs: 1
        )pb"),
        "async_service_test");
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return v1::JobConfig();
    ApplyDefaults(&*config);
    return *config;
  }();
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

std::vector<float> Floats(const std::string& bytes) {
  EXPECT_EQ(bytes.size() % sizeof(float), 0u);
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Multiples of 1/8 in [-8, 8]: with lr 0.25 every sum below is exact in
// float, whatever order the server applies the pushes in.
std::vector<float> Dyadic(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(k(rng)) / 8.0f;
  return v;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
}

// One asynchronous call; shared with its callback.
struct AsyncCall {
  grpc::ClientContext context;
  v1::AsyncPushPullRequest request;
  v1::AsyncPushPullResponse response;
  grpc::Status status;
  absl::Notification done;

  bool WaitDone() { return done.WaitForNotificationWithTimeout(absl::Seconds(20)); }
};

class AsyncServiceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (async_ != nullptr) async_->Shutdown();
    if (dense_ != nullptr) dense_->Shutdown();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    }
  }

  // Starts shard 0 of a job of `world` workers, registers every rank but
  // those in `unregistered` and writes the model x0_.
  void Start(uint32_t world, uint32_t staleness,
             const std::string& optimizer = "lr: 0.25",
             std::vector<uint32_t> unregistered = {}, bool init_model = true,
             const std::string& algorithm = R"(name: "async-sgd")") {
    config_ = MakeConfig(world, staleness, optimizer, algorithm);
    fingerprint_ = JobFingerprint(config_);
    absl::StatusOr<std::unique_ptr<ShardContext>> shard = ShardContext::Create(config_, 0);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    ASSERT_EQ(shard_->store().size(), kShardEnd);
    auto now = [this] { return absl::FromUnixSeconds(now_s_.load()); };
    absl::StatusOr<std::unique_ptr<ParameterServerService>> dense =
        ParameterServerService::Create(shard_.get(), {.now = now, .expiry_thread = false});
    ASSERT_TRUE(dense.ok()) << dense.status();
    dense_ = std::move(*dense);
    absl::StatusOr<std::unique_ptr<AsyncService>> async =
        AsyncService::Create(shard_.get(), {.now = now, .expiry_thread = false});
    ASSERT_TRUE(async.ok()) << async.status();
    async_ = std::move(*async);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(dense_.get());
    builder.RegisterService(async_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                       grpc::InsecureChannelCredentials());
    dense_stub_ = v1::ParameterServer::NewStub(channel);
    async_stub_ = v1::AsyncParameterServer::NewStub(channel);

    for (uint32_t r = 0; r < world; ++r) {
      if (std::find(unregistered.begin(), unregistered.end(), r) != unregistered.end()) {
        continue;
      }
      v1::RegisterRequest request;
      *request.mutable_config() = config_;
      request.set_requested_rank(static_cast<int32_t>(r));
      request.set_worker_id(absl::StrCat("worker-", r));
      v1::RegisterResponse response;
      grpc::ClientContext context;
      SetDeadline(&context);
      grpc::Status s = dense_stub_->Register(&context, request, &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    x0_ = Dyadic(kShardEnd, rng_);
    if (!init_model) return;
    for (const Chunk& c : ShardChunks()) {
      v1::PushModelRequest request;
      request.set_fingerprint(fingerprint_);
      request.set_rank(0);
      request.set_offset(c.offset);
      request.set_values(Bytes(std::vector<float>(x0_.begin() + c.offset,
                                                  x0_.begin() + c.offset + c.count)));
      v1::PushModelResponse response;
      grpc::ClientContext context;
      SetDeadline(&context);
      grpc::Status s = dense_stub_->PushModel(&context, request, &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }

  v1::AsyncPushPullRequest MakePush(uint32_t rank, uint64_t step, uint64_t offset,
                                    const std::vector<float>& g, float lr = 0.25f) const {
    v1::AsyncPushPullRequest request;
    request.set_fingerprint(fingerprint_);
    request.set_rank(rank);
    request.set_step(step);
    request.set_lr(lr);
    request.set_offset(offset);
    request.set_gradient(Bytes(g));
    return request;
  }

  grpc::Status Push(const v1::AsyncPushPullRequest& request,
                    v1::AsyncPushPullResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return async_stub_->AsyncPushPull(&context, request, response);
  }

  std::shared_ptr<AsyncCall> PushAsync(const v1::AsyncPushPullRequest& request) {
    auto call = std::make_shared<AsyncCall>();
    call->request = request;
    SetDeadline(&call->context);
    async_stub_->async()->AsyncPushPull(&call->context, &call->request, &call->response,
                                        [call](grpc::Status status) {
                                          call->status = std::move(status);
                                          call->done.Notify();
                                        });
    return call;
  }

  // The whole shard, chunk by chunk.
  std::vector<float> PullShard() {
    std::vector<float> out;
    for (const Chunk& c : ShardChunks()) {
      v1::PullModelRequest request;
      request.set_fingerprint(fingerprint_);
      request.set_offset(c.offset);
      request.set_count(c.count);
      v1::PullModelResponse response;
      grpc::ClientContext context;
      SetDeadline(&context);
      grpc::Status s = dense_stub_->PullModel(&context, request, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      std::vector<float> part = Floats(response.values());
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  v1::JobConfig config_;
  uint64_t fingerprint_ = 0;
  std::mt19937 rng_{99};
  std::vector<float> x0_;
  std::atomic<int64_t> now_s_{1000};  // outlives the services
  std::unique_ptr<ShardContext> shard_;
  std::unique_ptr<ParameterServerService> dense_;
  std::unique_ptr<AsyncService> async_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::ParameterServer::Stub> dense_stub_;
  std::unique_ptr<v1::AsyncParameterServer::Stub> async_stub_;
};

TEST_F(AsyncServiceTest, EveryWorkersUpdatesLandInTheModel) {
  constexpr uint32_t kWorld = 3;
  constexpr int kSteps = 4;
  constexpr float kLr = 0.25f;
  Start(kWorld, /*staleness=*/0);
  std::vector<std::vector<float>> g;
  for (uint32_t r = 0; r < kWorld; ++r) g.push_back(Dyadic(kShardEnd, rng_));

  std::vector<grpc::Status> failures(kWorld);
  std::vector<std::thread> workers;
  for (uint32_t r = 0; r < kWorld; ++r) {
    workers.emplace_back([&, r] {
      for (int t = 0; t < kSteps; ++t) {
        for (const Chunk& c : ShardChunks()) {
          v1::AsyncPushPullResponse response;
          grpc::Status s = Push(
              MakePush(r, t, c.offset,
                       std::vector<float>(g[r].begin() + c.offset,
                                          g[r].begin() + c.offset + c.count)),
              &response);
          if (!s.ok()) {
            failures[r] = s;
            return;
          }
          if (response.offset() != c.offset ||
              response.model().size() != c.count * sizeof(float)) {
            failures[r] = grpc::Status(grpc::StatusCode::INTERNAL, "bad reply shape");
            return;
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(failures[r].ok()) << "rank " << r << ": " << failures[r].error_message();
  }
  std::vector<float> expected = x0_;
  for (size_t i = 0; i < expected.size(); ++i) {
    float sum = 0;
    for (uint32_t r = 0; r < kWorld; ++r) sum += g[r][i];
    expected[i] -= kLr * kSteps * sum;
  }
  EXPECT_TRUE(PullShard() == expected) << "some pushes were lost or applied twice";
}

class AsyncMomentumTest
    : public AsyncServiceTest,
      public ::testing::WithParamInterface<v1::OptimizerConfig::Momentum> {};

// One momentum buffer per shard, fed by both ranks' pushes in the order they
// are applied, at x as it is when each push lands: against the rule written
// out by the tests (ReferenceDirection) run over the shard.
TEST_P(AsyncMomentumTest, ServerMomentumMatchesADirectLoop) {
  const v1::OptimizerConfig::Momentum kind = GetParam();
  const std::string optimizer = absl::StrCat(
      "lr: 0.1 momentum_kind: ", v1::OptimizerConfig::Momentum_Name(kind),
      kind == v1::OptimizerConfig::NONE ? "" : " momentum: 0.9",
      " weight_decay: 0.01");
  Start(2, /*staleness=*/0, optimizer);
  testing::ReferenceDirection direction(config_.optimizer(), kShardEnd);
  std::vector<float> x = x0_;
  std::vector<float> p(kShardEnd);
  std::normal_distribution<float> normal;
  uint64_t step[2] = {0, 0};
  for (int push = 0; push < 6; ++push) {
    const uint32_t rank = push % 2;
    const float lr = 0.1f / static_cast<float>(1 + push);
    std::vector<float> g(kShardEnd);
    for (float& v : g) v = normal(rng_);
    p = direction.Compute(g, x);
    for (size_t i = 0; i < x.size(); ++i) x[i] -= lr * p[i];
    for (const Chunk& c : ShardChunks()) {
      v1::AsyncPushPullResponse response;
      grpc::Status s = Push(
          MakePush(rank, step[rank], c.offset,
                   std::vector<float>(g.begin() + c.offset, g.begin() + c.offset + c.count),
                   lr),
          &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(response.step(), step[rank]);
      const std::vector<float> got = Floats(response.model());
      ASSERT_EQ(got.size(), c.count);
      for (uint64_t i = 0; i < c.count; ++i) {
        ASSERT_NEAR(got[i], x[c.offset + i], 1e-5f * (1 + std::fabs(x[c.offset + i])))
            << "push " << push << " float " << c.offset + i;
      }
    }
    ++step[rank];
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, AsyncMomentumTest,
                         ::testing::Values(v1::OptimizerConfig::NONE,
                                           v1::OptimizerConfig::HEAVY_BALL,
                                           v1::OptimizerConfig::NESTEROV),
                         [](const auto& info) {
                           return v1::OptimizerConfig::Momentum_Name(info.param);
                         });

TEST_F(AsyncServiceTest, PushBeyondTheStalenessBoundWaitsForTheSlowest) {
  Start(3, /*staleness=*/2);
  const Chunk c = ShardChunks()[0];
  auto grad = [&] { return Dyadic(c.count, rng_); };
  std::vector<float> expected(x0_.begin(), x0_.begin() + c.count);
  auto apply = [&](const std::vector<float>& g) {
    for (uint64_t i = 0; i < c.count; ++i) expected[i] -= 0.25f * g[i];
  };
  v1::AsyncPushPullResponse response;
  for (uint64_t t = 0; t < 2; ++t) {
    const std::vector<float> g = grad();
    ASSERT_TRUE(Push(MakePush(0, t, c.offset, g), &response).ok());
    apply(g);
  }
  // Step 2 is more than s = 2 ahead of ranks 1 and 2 (nothing yet).
  const std::vector<float> g_fast = grad();
  auto fast = PushAsync(MakePush(0, 2, c.offset, g_fast));
  ASSERT_TRUE(async_->WaitForParkedPushes(1, absl::Seconds(20)));

  // Rank 1 catching up is not enough: rank 2 is still the slowest. Its
  // completed round trip shows the server served it meanwhile.
  const std::vector<float> g1 = grad();
  ASSERT_TRUE(Push(MakePush(1, 0, c.offset, g1), &response).ok());
  apply(g1);
  EXPECT_FALSE(fast->done.HasBeenNotified());
  EXPECT_EQ(async_->parked_pushes(), 1u);

  const std::vector<float> g2 = grad();
  ASSERT_TRUE(Push(MakePush(2, 0, c.offset, g2), &response).ok());
  apply(g2);
  ASSERT_TRUE(fast->WaitDone());
  EXPECT_TRUE(fast->status.ok()) << fast->status.error_message();
  // Applied after it was released: its answer holds every push.
  apply(g_fast);
  EXPECT_TRUE(Floats(fast->response.model()) == expected);
  EXPECT_EQ(async_->parked_pushes(), 0u);
}

TEST_F(AsyncServiceTest, DeadWorkerNoLongerHoldsTheOthersBack) {
  Start(2, /*staleness=*/1);
  const Chunk c = ShardChunks()[1];
  const std::vector<float> zeros(c.count, 0.0f);
  v1::AsyncPushPullResponse response;
  ASSERT_TRUE(Push(MakePush(1, 0, c.offset, zeros), &response).ok());
  ASSERT_TRUE(Push(MakePush(0, 0, c.offset, zeros), &response).ok());
  ASSERT_TRUE(Push(MakePush(0, 1, c.offset, zeros), &response).ok());
  auto fast = PushAsync(MakePush(0, 2, c.offset, zeros));
  ASSERT_TRUE(async_->WaitForParkedPushes(1, absl::Seconds(20)));

  // Rank 1 went silent at 1000 s; it is dead from 1000 + kTimeoutS on.
  now_s_ = 1000 + kTimeoutS - 1;
  EXPECT_EQ(async_->ExpireSilentRanks(absl::FromUnixSeconds(now_s_.load())), 0);
  EXPECT_FALSE(fast->done.HasBeenNotified());
  now_s_ = 1000 + kTimeoutS;
  EXPECT_EQ(async_->ExpireSilentRanks(absl::FromUnixSeconds(now_s_.load())), 1);
  ASSERT_TRUE(fast->WaitDone());
  EXPECT_TRUE(fast->status.ok()) << fast->status.error_message();
  // The job goes on without rank 1.
  for (uint64_t t = 3; t < 6; ++t) {
    grpc::Status s = Push(MakePush(0, t, c.offset, zeros), &response);
    EXPECT_TRUE(s.ok()) << "step " << t << ": " << s.error_message();
  }

  // Rank 1 returns at step 1, counts from rank 0's step 5 and holds rank 0
  // back again from there, but not a retry of a push applied already,
  // which only reads the floats back; shutting down answers the parked
  // push.
  ASSERT_TRUE(Push(MakePush(1, 1, c.offset, zeros), &response).ok());
  const grpc::Status retried = Push(MakePush(0, 5, c.offset, zeros), &response);
  EXPECT_TRUE(retried.ok()) << retried.error_message();
  ASSERT_TRUE(Push(MakePush(0, 6, c.offset, zeros), &response).ok());
  EXPECT_EQ(async_->parked_pushes(), 0u);
  auto held = PushAsync(MakePush(0, 7, c.offset, zeros));
  ASSERT_TRUE(async_->WaitForParkedPushes(1, absl::Seconds(20)));
  async_->Shutdown();
  ASSERT_TRUE(held->WaitDone());
  EXPECT_EQ(held->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(held->status.error_message(), HasSubstr("shutting down"));
}

TEST_F(AsyncServiceTest, RetriedPushIsAppliedOnce) {
  Start(1, /*staleness=*/0);
  const Chunk c = ShardChunks()[0];
  const std::vector<float> g = Dyadic(c.count, rng_);
  v1::AsyncPushPullResponse first, retry;
  ASSERT_TRUE(Push(MakePush(0, 0, c.offset, g), &first).ok());
  ASSERT_TRUE(Push(MakePush(0, 0, c.offset, g), &retry).ok());
  std::vector<float> expected(x0_.begin(), x0_.begin() + c.count);
  for (uint64_t i = 0; i < c.count; ++i) expected[i] -= 0.25f * g[i];
  EXPECT_TRUE(Floats(first.model()) == expected);
  EXPECT_TRUE(Floats(retry.model()) == expected);
  // The next step is applied.
  ASSERT_TRUE(Push(MakePush(0, 1, c.offset, g), &retry).ok());
  for (uint64_t i = 0; i < c.count; ++i) expected[i] -= 0.25f * g[i];
  EXPECT_TRUE(Floats(retry.model()) == expected);
  // An older step is no retry (its worker has gone on) but a step number
  // used again, as by a worker restarted from an earlier state: refused,
  // where it was answered as applied and dropped.
  const grpc::Status reused = Push(MakePush(0, 0, c.offset, g), &retry);
  EXPECT_EQ(reused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(reused.error_message(),
              HasSubstr("step 0 is older than step 1, applied already for rank 0"));
  EXPECT_EQ(async_->counters().pushes_applied, 2u);
  ASSERT_TRUE(Push(MakePush(0, 2, c.offset, g), &retry).ok());
  for (uint64_t i = 0; i < c.count; ++i) expected[i] -= 0.25f * g[i];
  EXPECT_TRUE(Floats(retry.model()) == expected);
}

TEST_F(AsyncServiceTest, BadInputIsRefusedAndTheServerKeepsServing) {
  Start(3, /*staleness=*/0, "lr: 0.25", /*unregistered=*/{2});
  const uint64_t chunk = ChunkFloats(kMaxMessageBytes);
  const std::vector<float> one(8, 1.0f);
  struct Case {
    std::string name;
    v1::AsyncPushPullRequest request;
    grpc::StatusCode code;
    std::vector<std::string> fragments;
  };
  std::vector<Case> cases;
  {
    v1::AsyncPushPullRequest r = MakePush(0, 0, 0, one);
    r.set_gradient(std::string(5, '\0'));
    cases.push_back({"not whole floats", r, grpc::StatusCode::INVALID_ARGUMENT,
                     {"5 bytes", "rank 0"}});
  }
  cases.push_back({"over the chunk limit",
                   MakePush(0, 0, 0, std::vector<float>(chunk + 1, 0.0f)),
                   grpc::StatusCode::INVALID_ARGUMENT, {"chunk limit"}});
  cases.push_back({"empty", MakePush(0, 0, 0, {}), grpc::StatusCode::INVALID_ARGUMENT,
                   {"empty"}});
  cases.push_back({"offset in the other shard", MakePush(0, 0, kShardEnd, one),
                   grpc::StatusCode::OUT_OF_RANGE,
                   {absl::StrCat("[", kShardEnd, ", ", kShardEnd + 8, ")"), "shard 0"}});
  cases.push_back({"range crossing the shard end", MakePush(0, 0, kShardEnd - 4, one),
                   grpc::StatusCode::OUT_OF_RANGE, {"not inside shard 0"}});
  // Retries are told apart by offset: pushes must be the shard's chunks.
  cases.push_back({"not a chunk", MakePush(0, 0, 8, one), grpc::StatusCode::INVALID_ARGUMENT,
                   {"floats [8, 16) are not one of shard 0's chunks"}});
  cases.push_back({"part of a chunk", MakePush(0, 0, 0, one), grpc::StatusCode::INVALID_ARGUMENT,
                   {"floats [0, 8) are not one of shard 0's chunks"}});
  cases.push_back({"unregistered rank", MakePush(2, 0, 0, one),
                   grpc::StatusCode::FAILED_PRECONDITION, {"rank 2 has not registered"}});
  cases.push_back({"rank out of range", MakePush(7, 0, 0, one),
                   grpc::StatusCode::INVALID_ARGUMENT, {"rank 7 is out of range"}});
  {
    v1::AsyncPushPullRequest r = MakePush(0, 0, 0, one);
    r.set_fingerprint(fingerprint_ + 1);
    cases.push_back({"fingerprint", r, grpc::StatusCode::FAILED_PRECONDITION,
                     {"fingerprint"}});
  }
  cases.push_back({"lr NaN", MakePush(0, 0, 0, one, std::nanf("")),
                   grpc::StatusCode::INVALID_ARGUMENT, {"lr"}});
  cases.push_back({"lr negative", MakePush(0, 0, 0, one, -1.0f),
                   grpc::StatusCode::INVALID_ARGUMENT, {"lr"}});
  // It would pass the staleness gate as a negative step, and hide the
  // rank's later pushes at that offset as old ones.
  cases.push_back({"step beyond any run's", MakePush(0, uint64_t{1} << 62, 0, one),
                   grpc::StatusCode::INVALID_ARGUMENT,
                   {"step 4611686018427387904 is beyond any run's"}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::AsyncPushPullResponse response;
    grpc::Status s = Push(c.request, &response);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    for (const std::string& f : c.fragments) {
      EXPECT_THAT(s.error_message(), AllOf(HasSubstr(f), HasSubstr("AsyncPushPull")));
    }
  }
  // Nothing refused was applied, and a valid push still is.
  EXPECT_TRUE(PullShard() == x0_);
  v1::AsyncPushPullResponse response;
  const Chunk c1 = ShardChunks()[1];
  grpc::Status s = Push(MakePush(1, 0, c1.offset, std::vector<float>(c1.count, 1.0f)), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<float> expected(x0_.begin() + c1.offset, x0_.begin() + c1.offset + c1.count);
  for (float& v : expected) v -= 0.25f;
  EXPECT_TRUE(Floats(response.model()) == expected);
  // Rank 0's pushes at offset 0 are still applied from step 0 on.
  const Chunk c0 = ShardChunks()[0];
  s = Push(MakePush(0, 0, 0, std::vector<float>(c0.count, 1.0f)), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  expected.assign(x0_.begin(), x0_.begin() + c0.count);
  for (float& v : expected) v -= 0.25f;
  EXPECT_TRUE(Floats(response.model()) == expected);
}

TEST_F(AsyncServiceTest, PushBeforeTheModelIsInitialisedIsRefused) {
  Start(1, /*staleness=*/0, "lr: 0.25", {}, /*init_model=*/false);
  v1::AsyncPushPullResponse response;
  const Chunk c = ShardChunks()[0];
  grpc::Status s = Push(MakePush(0, 0, 0, std::vector<float>(c.count, 1.0f)), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("no model yet"));
}

// The servers of a job whose rounds are averages must not apply gradients
// pushed around those rounds.
struct OtherAlgorithm {
  std::string name;
  std::string params;
};

class AsyncPushToAnotherAlgorithmTest : public AsyncServiceTest,
                                        public ::testing::WithParamInterface<OtherAlgorithm> {};

TEST_P(AsyncPushToAnotherAlgorithmTest, IsRefused) {
  Start(1, /*staleness=*/0, "lr: 0.25", {}, /*init_model=*/true,
        absl::StrCat("name: \"", GetParam().name, "\" ", GetParam().params));
  v1::AsyncPushPullResponse response;
  grpc::Status s = Push(MakePush(0, 0, 0, std::vector<float>(8, 1.0f)), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr(absl::StrCat("algorithm ", GetParam().name)), HasSubstr("async-sgd"),
                    HasSubstr("AsyncPushPull")));
  EXPECT_TRUE(PullShard() == x0_);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AsyncPushToAnotherAlgorithmTest,
                         ::testing::Values(OtherAlgorithm{"ssgd", ""},
                                           OtherAlgorithm{"ef-sgd", "ratio: 4"},
                                           OtherAlgorithm{"gtopk-ssgd", "density: 0.05"}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace cserps
