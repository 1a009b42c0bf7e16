// The ParameterServer service over real gRPC: servers run in-process on
// 127.0.0.1:0 and the tests talk to them through the generated stub.
#include "server/parameter_server_service.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/block_layout.h"
#include "common/config.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"

namespace cserps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// SOFTMAX 3300 -> 10: d = 33010 floats, 33 blocks of 1024 (the last 242
// floats), two shards of ceil(33/2) = 17 blocks: shard 0 owns floats
// [0, 17408), shard 1 [17408, 33010). With 64 KiB messages shard 0's payload
// needs two chunks and shard 1's one.
constexpr uint64_t kInputDim = 3300;
constexpr uint64_t kClasses = 10;
constexpr uint64_t kD = kInputDim * kClasses + kClasses;
constexpr uint64_t kBlock = 1024;
constexpr uint32_t kMaxMessageBytes = 64 * 1024;
constexpr int kTimeoutS = 30;
constexpr int kMaxStepLag = 3;
constexpr int kRetained = 2;

uint64_t ShardFirst(uint32_t shard) {
  const uint64_t blocks = (kD + kBlock - 1) / kBlock;
  const uint64_t per_shard = (blocks + 1) / 2;
  return std::min(kD, shard * per_shard * kBlock);
}
uint64_t ShardEnd(uint32_t shard) { return shard == 0 ? ShardFirst(1) : kD; }
uint64_t ShardLen(uint32_t shard) { return ShardEnd(shard) - ShardFirst(shard); }

// The chunk size follows from the message limit (tested in
// tests/common/block_layout_test.cc).
uint64_t ChunkLen(uint32_t shard, uint32_t chunk) {
  const uint64_t per_chunk = ChunkFloats(kMaxMessageBytes);
  const uint64_t begin = chunk * per_chunk;
  return std::min(per_chunk, ShardLen(shard) - begin);
}
uint32_t NumChunksOf(uint32_t shard) {
  const uint64_t per_chunk = ChunkFloats(kMaxMessageBytes);
  return static_cast<uint32_t>((ShardLen(shard) + per_chunk - 1) / per_chunk);
}

std::string ConfigText(uint32_t num_workers) {
  return absl::StrCat(R"pb(
    name: "service-test"
    seed: 7
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: )pb", num_workers, R"pb(
      max_message_bytes: )pb", kMaxMessageBytes, R"pb(
      round_timeout_s: )pb", kTimeoutS, R"pb(
      max_step_lag: )pb", kMaxStepLag, R"pb(
      retained_rounds: )pb", kRetained, R"pb(
    }
    model { kind: SOFTMAX input_dim: )pb", kInputDim, R"pb( num_classes: )pb",
                      kClasses, R"pb( }
    data { batch_size: 8 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" block_size: )pb", kBlock, R"pb( }
    epochs: 1
    output_dir: "out/service-test"
  )pb");
}

v1::JobConfig MakeConfig(uint32_t num_workers) {
  absl::StatusOr<v1::JobConfig> config =
      ParseJobConfig(ConfigText(num_workers), "service_test");
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return v1::JobConfig();
  ApplyDefaults(&*config);
  return *config;
}

void SetDeadline(grpc::ClientContext* context,
                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

std::vector<float> Floats(const std::string& bytes) {
  EXPECT_EQ(bytes.size() % sizeof(float), 0u);
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

// Multiples of 1/8 in [-8, 8]: with weights summing to a power of two and
// lr 0.25, every sum, mean and update below is exact in float, whatever the
// order of the server's additions.
std::vector<float> DyadicValues(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(k(rng)) / 8.0f;
  return v;
}

std::vector<float> WeightedMean(const std::vector<std::vector<float>>& values,
                                const std::vector<float>& weights) {
  std::vector<float> out(values[0].size());
  double total = 0;
  for (float w : weights) total += w;
  for (size_t i = 0; i < out.size(); ++i) {
    double s = 0;
    for (size_t r = 0; r < values.size(); ++r) s += double{weights[r]} * values[r][i];
    out[i] = static_cast<float>(s / total);
  }
  return out;
}

// Weights summing to 4 (see DyadicValues), unequal so that an unweighted
// mean would differ.
std::vector<float> WeightsFor(uint32_t world) {
  switch (world) {
    case 1: return {4.0f};
    case 2: return {1.0f, 3.0f};
    default: return {1.0f, 2.0f, 1.0f};
  }
}

// One asynchronous call; shared with its callback so that nothing it
// touches can die before the callback has run.
template <typename Request, typename Response>
struct AsyncCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  grpc::Status status;
  absl::Notification done;

  bool WaitDone() { return done.WaitForNotificationWithTimeout(absl::Seconds(20)); }
};
using AsyncPush = AsyncCall<v1::PushPullRequest, v1::PushPullResponse>;
using AsyncPull = AsyncCall<v1::PullModelRequest, v1::PullModelResponse>;

// The first of `calls` to be answered, or null when none is within 30 s.
template <typename Call>
std::shared_ptr<Call> FirstAnswered(const std::vector<std::shared_ptr<Call>>& calls) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    for (const auto& call : calls) {
      if (call->done.WaitForNotificationWithTimeout(absl::Milliseconds(1))) return call;
    }
  }
  return nullptr;
}

struct RoundResult {
  grpc::Status status;
  v1::PushPullResponse response;
};

class ServiceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
  }

  // Starts shard `shard` of a job of `world` workers and connects to it.
  // `mutate` (optional) changes the job config first.
  void Start(uint32_t world, uint32_t shard = 0, ParameterServerService::Options options = {},
             const std::function<void(v1::JobConfig*)>& mutate = nullptr) {
    world_ = world;
    shard_ = shard;
    config_ = MakeConfig(world);
    if (mutate) mutate(&config_);
    fingerprint_ = JobFingerprint(config_);
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        PsServer::Start(config_, shard, "127.0.0.1:0", std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::ParameterServer::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Register(int32_t requested, const std::string& worker_id,
                        v1::RegisterResponse* response,
                        const v1::JobConfig* config = nullptr) {
    v1::RegisterRequest request;
    *request.mutable_config() = config != nullptr ? *config : config_;
    request.set_requested_rank(requested);
    request.set_worker_id(worker_id);
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->Register(&context, request, response);
  }

  void RegisterAll() {
    for (uint32_t r = 0; r < world_; ++r) {
      v1::RegisterResponse response;
      grpc::Status s = Register(static_cast<int32_t>(r), absl::StrCat("worker-", r), &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
      ASSERT_EQ(response.rank(), r);
    }
  }

  v1::PushPullRequest MakePush(uint32_t rank, uint64_t step, v1::Stream stream,
                               uint32_t chunk, float weight, float lr,
                               const std::vector<float>& values) const {
    v1::PushPullRequest request;
    request.set_fingerprint(fingerprint_);
    request.set_rank(rank);
    request.set_step(step);
    request.set_stream(stream);
    request.set_ratio(1);
    request.set_chunk(chunk);
    request.set_weight(weight);
    request.set_lr(lr);
    request.set_values(Bytes(values));
    return request;
  }

  // A valid push of zeros from rank 0 with the given fields changed by the
  // caller.
  v1::PushPullRequest ValidPush(uint64_t step = 1, uint32_t chunk = 0) const {
    return MakePush(0, step, v1::GRAD, chunk, 1.0f, 0.25f,
                    std::vector<float>(ChunkLen(shard_, chunk), 0.0f));
  }

  grpc::Status PushPull(const v1::PushPullRequest& request,
                        v1::PushPullResponse* response) {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->PushPull(&context, request, response);
  }

  std::shared_ptr<AsyncPush> PushPullAsync(const v1::PushPullRequest& request) {
    auto call = std::make_shared<AsyncPush>();
    call->request = request;
    SetDeadline(&call->context, std::chrono::seconds(20));
    stub_->async()->PushPull(&call->context, &call->request, &call->response,
                             [call](grpc::Status status) {
                               call->status = std::move(status);
                               call->done.Notify();
                             });
    return call;
  }

  std::shared_ptr<AsyncPull> PullModelAsync(uint64_t offset, uint64_t count,
                                            bool wait_for_init,
                                            std::chrono::milliseconds timeout =
                                                std::chrono::seconds(20)) {
    auto call = std::make_shared<AsyncPull>();
    call->request.set_fingerprint(fingerprint_);
    call->request.set_offset(offset);
    call->request.set_count(count);
    call->request.set_wait_for_init(wait_for_init);
    SetDeadline(&call->context, timeout);
    stub_->async()->PullModel(&call->context, &call->request, &call->response,
                              [call](grpc::Status status) {
                                call->status = std::move(status);
                                call->done.Notify();
                              });
    return call;
  }

  v1::GetStatusResponse GetStatus() {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetStatusResponse response;
    grpc::Status s = stub_->GetStatus(&context, v1::GetStatusRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // Polls GetStatus until `pred` holds; bounded by a wall-clock limit.
  template <typename Pred>
  bool StatusBecomes(Pred pred) {
    const absl::Time limit = absl::Now() + absl::Seconds(20);
    while (absl::Now() < limit) {
      if (pred(GetStatus())) return true;
    }
    return false;
  }

  grpc::Status PushModel(uint32_t rank, uint64_t offset,
                         const std::string& bytes,
                         v1::PushModelResponse* response) {
    v1::PushModelRequest request;
    request.set_fingerprint(fingerprint_);
    request.set_rank(rank);
    request.set_offset(offset);
    request.set_values(bytes);
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->PushModel(&context, request, response);
  }

  grpc::Status PullModel(uint64_t offset, uint64_t count,
                         v1::PullModelResponse* response,
                         uint64_t fingerprint_delta = 0) {
    v1::PullModelRequest request;
    request.set_fingerprint(fingerprint_ + fingerprint_delta);
    request.set_offset(offset);
    request.set_count(count);
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->PullModel(&context, request, response);
  }

  // Writes `shard_values` (the whole shard) from rank 0, chunk by chunk.
  void InitModel(const std::vector<float>& shard_values) {
    ASSERT_EQ(shard_values.size(), ShardLen(shard_));
    const uint64_t per_chunk = ChunkFloats(kMaxMessageBytes);
    for (uint64_t begin = 0; begin < shard_values.size(); begin += per_chunk) {
      const uint64_t n = std::min<uint64_t>(per_chunk, shard_values.size() - begin);
      std::vector<float> part(shard_values.begin() + begin,
                              shard_values.begin() + begin + n);
      v1::PushModelResponse response;
      grpc::Status s = PushModel(0, ShardFirst(shard_) + begin, Bytes(part), &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(response.shard_initialised(), begin + n == shard_values.size());
    }
  }

  // The whole shard, pulled chunk by chunk.
  std::vector<float> PullShard() {
    std::vector<float> out;
    const uint64_t per_chunk = ChunkFloats(kMaxMessageBytes);
    for (uint64_t begin = 0; begin < ShardLen(shard_); begin += per_chunk) {
      const uint64_t n = std::min<uint64_t>(per_chunk, ShardLen(shard_) - begin);
      v1::PullModelResponse response;
      grpc::Status s = PullModel(ShardFirst(shard_) + begin, n, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(response.offset(), ShardFirst(shard_) + begin);
      std::vector<float> part = Floats(response.values());
      EXPECT_EQ(part.size(), n);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  // Every rank pushes values[rank] concurrently, each from its own thread
  // waiting on its own PushPull.
  std::vector<RoundResult> RunRound(uint64_t step, v1::Stream stream,
                                    uint32_t chunk,
                                    const std::vector<std::vector<float>>& values,
                                    const std::vector<float>& weights, float lr) {
    std::vector<RoundResult> results(values.size());
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < values.size(); ++r) {
      threads.emplace_back([&, r] {
        const v1::PushPullRequest request =
            MakePush(r, step, stream, chunk, weights[r], lr, values[r]);
        results[r].status = PushPull(request, &results[r].response);
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // Runs a round of every rank for (step, stream, chunk) on random values and
  // checks that each rank gets the weighted mean; returns it.
  std::vector<float> ExpectRoundCompletes(uint64_t step,
                                          v1::Stream stream = v1::MODEL,
                                          uint32_t chunk = 0, float lr = 0.25f) {
    std::vector<std::vector<float>> values;
    for (uint32_t r = 0; r < world_; ++r) {
      values.push_back(DyadicValues(ChunkLen(shard_, chunk), rng_));
    }
    const std::vector<float> weights = WeightsFor(world_);
    const std::vector<float> expected = WeightedMean(values, weights);
    std::vector<RoundResult> results = RunRound(step, stream, chunk, values, weights, lr);
    for (uint32_t r = 0; r < world_; ++r) {
      SCOPED_TRACE(testing::Message() << "rank " << r << " step " << step
                                      << " chunk " << chunk);
      EXPECT_TRUE(results[r].status.ok()) << results[r].status.error_message();
      EXPECT_EQ(results[r].response.step(), step);
      EXPECT_EQ(results[r].response.stream(), stream);
      EXPECT_EQ(results[r].response.chunk(), chunk);
      EXPECT_TRUE(Floats(results[r].response.mean()) == expected)
          << "mean differs from the weighted mean";
    }
    return expected;
  }

  // A refused push: code, message fragments, no round left open, and the
  // server still completes a round afterwards.
  void ExpectRefused(const v1::PushPullRequest& request, grpc::StatusCode code,
                     const std::vector<std::string>& fragments,
                     uint64_t next_step = 1) {
    v1::PushPullResponse response;
    grpc::Status s = PushPull(request, &response);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    for (const std::string& f : fragments) {
      EXPECT_THAT(s.error_message(), HasSubstr(f));
    }
    EXPECT_EQ(GetStatus().open_rounds(), 0u) << "a refused push opened a round";
    ExpectRoundCompletes(next_step);
  }

  uint32_t world_ = 0;
  uint32_t shard_ = 0;
  v1::JobConfig config_;
  uint64_t fingerprint_ = 0;
  std::mt19937 rng_{2024};
  std::atomic<int64_t> fake_now_s_{1000};  // outlives server_
  std::unique_ptr<PsServer> server_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// ---------------------------------------------------------------- Register

TEST_F(ServiceTest, RegisterAnswersRankAndShardLayout) {
  for (uint32_t shard : {0u, 1u}) {
    SCOPED_TRACE(testing::Message() << "shard " << shard);
    Start(2, shard);
    v1::RegisterResponse response;
    grpc::Status s = Register(-1, "host:1", &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.rank(), 0u);
    EXPECT_EQ(response.world_size(), 2u);
    EXPECT_EQ(response.job_seed(), 7u);
    EXPECT_EQ(response.fingerprint(), JobFingerprint(config_));
    EXPECT_EQ(response.model_size(), kD);
    EXPECT_EQ(response.block_size(), kBlock);
    EXPECT_EQ(response.shard().shard(), shard);
    EXPECT_EQ(response.shard().num_shards(), 2u);
    EXPECT_EQ(response.shard().first_float(), ShardFirst(shard));
    EXPECT_EQ(response.shard().end_float(), ShardEnd(shard));
    EXPECT_EQ(response.shard().first_block(), ShardFirst(shard) / kBlock);
    EXPECT_EQ(response.shard().end_block(), (ShardEnd(shard) + kBlock - 1) / kBlock);
    TearDown();
  }
}

TEST_F(ServiceTest, RegisterTwiceWithTheSameWorkerIdGetsTheSameRank) {
  Start(3);
  v1::RegisterResponse a, b, again;
  ASSERT_TRUE(Register(-1, "host-a:10", &a).ok());
  ASSERT_TRUE(Register(-1, "host-b:11", &b).ok());
  ASSERT_TRUE(Register(-1, "host-a:10", &again).ok());
  EXPECT_EQ(a.rank(), 0u);
  EXPECT_EQ(b.rank(), 1u);
  EXPECT_EQ(again.rank(), a.rank());
  EXPECT_EQ(GetStatus().registered(), 2u);
}

TEST_F(ServiceTest, RegisterRankErrors) {
  Start(2);
  v1::RegisterResponse response;
  grpc::Status s = Register(2, "w", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("rank 2"));

  ASSERT_TRUE(Register(1, "holder-x", &response).ok());
  s = Register(1, "intruder-y", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("holder-x"));

  ASSERT_TRUE(Register(-1, "w0", &response).ok());
  s = Register(-1, "one-too-many", &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(GetStatus().registered(), 2u);
}

TEST_F(ServiceTest, RegisterWithADifferentJobConfigNamesTheField) {
  Start(2);
  struct Change {
    std::string field;
    std::function<void(v1::JobConfig*)> apply;
  };
  const std::vector<Change> changes = {
      {"optimizer.lr", [](v1::JobConfig* c) { c->mutable_optimizer()->set_lr(0.05f); }},
      {"algorithm.block_size",
       [](v1::JobConfig* c) { c->mutable_algorithm()->set_block_size(512); }},
      {"cluster.num_workers",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_num_workers(3); }},
      {"seed", [](v1::JobConfig* c) { c->set_seed(8); }},
  };
  for (const Change& change : changes) {
    v1::JobConfig theirs = config_;
    change.apply(&theirs);
    v1::RegisterResponse response;
    grpc::Status s = Register(-1, "w", &response, &theirs);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << change.field << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(change.field));
  }
  EXPECT_EQ(GetStatus().registered(), 0u) << "a refused Register took a rank";

  // Local fields may differ.
  v1::JobConfig local = config_;
  local.set_output_dir("elsewhere");
  local.mutable_checkpoint()->set_dir("/tmp/elsewhere");
  local.mutable_checkpoint()->set_keep(7);
  local.mutable_data()->set_dir("/tmp/other-data");
  local.mutable_cluster()->set_servers(0, "10.0.0.1:5000");
  local.mutable_cluster()->set_servers(1, "10.0.0.2:5000");
  v1::RegisterResponse response;
  grpc::Status s = Register(-1, "worker-0", &response, &local);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(Register(-1, "worker-1", &response).ok());
  ExpectRoundCompletes(1);
}

// ------------------------------------------------------- PushPull refusals

class RefusalTest : public ServiceTest {
 protected:
  void SetUp() override {
    Start(2);
    RegisterAll();
  }
};

TEST_F(RefusalTest, WrongPayloadLengthNamesExpectedAndGot) {
  // Chunk 1 of shard 0 is the short tail.
  const uint64_t want = ChunkLen(0, 1);
  v1::PushPullRequest request = ValidPush(1, 1);
  request.set_values(Bytes(std::vector<float>(want - 1, 1.0f)));
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                {absl::StrCat("expected ", want),
                 absl::StrCat("got ", (want - 1) * sizeof(float), " bytes"),
                 "rank 0"});

  const uint64_t full = ChunkLen(0, 0);
  request = ValidPush(1, 0);
  request.set_values(Bytes(std::vector<float>(full + 1, 1.0f)));
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                {absl::StrCat("expected ", full),
                 absl::StrCat("got ", (full + 1) * sizeof(float), " bytes")},
                2);

  request.set_values("abc");
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, {"got 3 bytes"}, 3);
}

TEST_F(RefusalTest, UnknownStream) {
  v1::PushPullRequest request = ValidPush();
  request.set_stream(static_cast<v1::Stream>(7));
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, {"unknown stream 7"});
  request.set_stream(v1::STREAM_UNSPECIFIED);
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, {"unknown stream 0"}, 2);
}

TEST_F(RefusalTest, CheckpointRoundsNeedACheckpointFolderAndRatioOne) {
  // This job takes no checkpoints.
  v1::PushPullRequest request = ValidPush();
  request.set_stream(v1::CHECKPOINT);
  ExpectRefused(request, grpc::StatusCode::FAILED_PRECONDITION,
                {"CHECKPOINT", "shard 0 takes no full averages", "checkpoint.dir"});
  request.set_ratio(2);
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, {"ratio must be 1", "got 2"}, 2);
}

TEST_F(RefusalTest, RankOutOfRange) {
  v1::PushPullRequest request = ValidPush();
  request.set_rank(2);
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                {"rank 2 is out of range", "2 workers"});
  request.set_rank(std::numeric_limits<uint32_t>::max());
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                {absl::StrCat("rank ", std::numeric_limits<uint32_t>::max())}, 2);
}

TEST_F(ServiceTest, RejoinIsRefusedNamingWhy) {
  auto rejoin = [&](uint32_t rank, uint64_t step, uint64_t fingerprint) {
    v1::RejoinRequest request;
    request.set_fingerprint(fingerprint);
    request.set_rank(rank);
    request.set_step(step);
    v1::RejoinResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub_->Rejoin(&context, request, &response);
  };
  Start(2);
  RegisterAll();
  grpc::Status s = rejoin(0, 4, fingerprint_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("Rejoin (rank 0, step 4)"));
  EXPECT_THAT(s.error_message(), HasSubstr("cluster.admit_every_steps is 0"));
  s = rejoin(0, 4, fingerprint_ + 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("fingerprint"));
  TearDown();

  Start(2, 0, {}, [](v1::JobConfig* c) {
    c->mutable_cluster()->set_elastic(true);
    c->mutable_cluster()->set_admit_every_steps(4);
  });
  s = rejoin(1, 4, fingerprint_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("has not registered"));
  RegisterAll();
  s = rejoin(1, 6, fingerprint_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("multiple of cluster.admit_every_steps 4"));
  s = rejoin(1, 4, fingerprint_);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("rank 1 is still a member"));
  EXPECT_EQ(GetStatus().members(), 2u);
}

TEST_F(ServiceTest, PushFromAnUnregisteredRankIsRefused) {
  Start(3);
  v1::RegisterResponse response;
  ASSERT_TRUE(Register(0, "w0", &response).ok());
  ASSERT_TRUE(Register(1, "w1", &response).ok());
  v1::PushPullRequest request = ValidPush();
  request.set_rank(2);
  v1::PushPullResponse pushed;
  grpc::Status s = PushPull(request, &pushed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("rank 2"), HasSubstr("Register")));
  EXPECT_EQ(GetStatus().open_rounds(), 0u);
  ASSERT_TRUE(Register(2, "w2", &response).ok());
  ExpectRoundCompletes(1);
}

TEST_F(RefusalTest, FingerprintMismatch) {
  v1::PushPullRequest request = ValidPush();
  request.set_fingerprint(fingerprint_ ^ 1);
  ExpectRefused(request, grpc::StatusCode::FAILED_PRECONDITION,
                {"fingerprint", absl::StrCat(fingerprint_ ^ 1),
                 absl::StrCat(fingerprint_)});
}

TEST_F(RefusalTest, StepTooFarAhead) {
  // Nothing completed yet: steps 0..max_step_lag are open.
  ExpectRefused(ValidPush(kMaxStepLag + 1), grpc::StatusCode::OUT_OF_RANGE,
                {"too far ahead", absl::StrCat("step ", kMaxStepLag + 1),
                 absl::StrCat("max_step_lag ", kMaxStepLag)},
                /*next_step=*/kMaxStepLag);
  EXPECT_EQ(GetStatus().newest_step(), static_cast<uint64_t>(kMaxStepLag));
  // The window moved with the completed round.
  ExpectRoundCompletes(2 * kMaxStepLag);
}

TEST_F(RefusalTest, StepTooFarBehindAfterRetirement) {
  // retained_rounds 2: completing GRAD steps 1, 2, 3 retires step 1.
  for (uint64_t step = 1; step <= 3; ++step) ExpectRoundCompletes(step, v1::GRAD);
  v1::PushPullResponse response;
  grpc::Status s = PushPull(ValidPush(1), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("too far behind"), HasSubstr("step 1")));
  s = PushPull(ValidPush(0), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("too far behind"));
  EXPECT_EQ(GetStatus().open_rounds(), 0u);

  // Step 4 completes and retires step 2; step 3 is still retained, so a
  // retry for it is answered rather than refused.
  ExpectRoundCompletes(4, v1::GRAD);
  s = PushPull(ValidPush(2), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("too far behind"));
  s = PushPull(ValidPush(3), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.step(), 3u);
  // Retirement is per stream: MODEL step 1 is still open to new rounds.
  ExpectRoundCompletes(1, v1::MODEL);
}

TEST_F(RefusalTest, RatioNotOne) {
  v1::PushPullRequest request = ValidPush();
  request.set_ratio(4);
  ExpectRefused(request, grpc::StatusCode::FAILED_PRECONDITION, {"ratio 4", "ssgd"});
  // Ratio 0 is not a ratio at all; either refusal code fits.
  request.set_ratio(0);
  v1::PushPullResponse response;
  grpc::Status s = PushPull(request, &response);
  EXPECT_THAT(s.error_code(), ::testing::AnyOf(grpc::StatusCode::INVALID_ARGUMENT,
                                               grpc::StatusCode::FAILED_PRECONDITION))
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("ratio"));
  EXPECT_EQ(GetStatus().open_rounds(), 0u);
  ExpectRoundCompletes(2);
}

TEST_F(RefusalTest, ChunkOutOfRange) {
  ASSERT_EQ(NumChunksOf(0), 2u);
  v1::PushPullRequest request = ValidPush();
  request.set_chunk(2);
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                {"chunk 2 is out of range", "2 chunks"});
}

TEST_F(RefusalTest, BadWeight) {
  uint64_t step = 1;
  for (float weight : {0.0f, -1.0f, std::nanf(""),
                       std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(testing::Message() << "weight " << weight);
    v1::PushPullRequest request = ValidPush(step);
    request.set_weight(weight);
    ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, {"weight"}, step);
    ++step;
  }
}

// A push its round table refuses (the weight, the step window) is refused
// input, not traffic of its stream (docs/metrics.md).
TEST_F(RefusalTest, PushesTheRoundTableRefusesCountAsRefused) {
  const uint64_t bad_before = server_->shard().bad_input();
  const ParameterServerService::Counters before = server_->service().counters();
  v1::PushPullRequest zero_weight = ValidPush(1);
  zero_weight.set_weight(0);
  const v1::PushPullRequest ahead = ValidPush(kMaxStepLag + 1);
  v1::PushPullResponse response;
  EXPECT_EQ(PushPull(zero_weight, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(PushPull(ahead, &response).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  const ParameterServerService::Counters after = server_->service().counters();
  EXPECT_EQ(server_->shard().bad_input() - bad_before, 2u);
  EXPECT_EQ(after.grad.request_bytes, before.grad.request_bytes);
  EXPECT_EQ(after.grad.request_floats, before.grad.request_floats);
  EXPECT_EQ(after.other.request_bytes - before.other.request_bytes,
            zero_weight.ByteSizeLong() + ahead.ByteSizeLong());
  // An accepted push still counts as its stream's.
  ExpectRoundCompletes(1, v1::GRAD);
  EXPECT_GT(server_->service().counters().grad.request_bytes, after.grad.request_bytes);
}

// ----------------------------------------------------------------- Rounds

TEST_F(ServiceTest, ConcurrentPushesGetTheWeightedMean) {
  Start(3);
  RegisterAll();
  ExpectRoundCompletes(1, v1::MODEL, 0);
  ExpectRoundCompletes(1, v1::MODEL, 1);
  ExpectRoundCompletes(1, v1::GRAD, 0);
  ExpectRoundCompletes(2, v1::GRAD, 0);
  const v1::GetStatusResponse status = GetStatus();
  EXPECT_EQ(status.rounds_completed(), 4u);
  EXPECT_EQ(status.open_rounds(), 0u);
}

// Every push of a round is counted before any member is answered: a member
// that reads the metrics once answered finds its round's requests in them.
// The last push completes the round and answers every member inside
// JoinRound.
TEST_F(ServiceTest, ARoundsPushesAreCountedBeforeItsMembersAreAnswered) {
  Start(3);
  RegisterAll();
  ParameterServerService& service = server_->service();
  const uint64_t before = service.counters().model.request_bytes;
  const std::vector<float> values(ChunkLen(shard_, 0), 1.0f);
  constexpr uint64_t kRequestBytes = 100;
  std::vector<uint64_t> seen;
  for (uint32_t r = 0; r < world_; ++r) {
    const ParameterServerService::PushPullHead head{fingerprint_, r, 1, v1::MODEL, 1, 0, 1.0f,
                                                    0.0f};
    service.JoinRound(head, values, kRequestBytes, service.Now(),
                      [&](absl::StatusOr<RoundMean> mean) {
                        EXPECT_TRUE(mean.ok()) << mean.status();
                        seen.push_back(service.counters().model.request_bytes - before);
                      });
  }
  EXPECT_EQ(seen, std::vector<uint64_t>(world_, world_ * kRequestBytes));
}

// Runs a round on every chunk of the shard and returns the concatenated mean.
class ModelUpdateTest : public ServiceTest,
                        public ::testing::WithParamInterface<uint32_t> {
 protected:
  std::vector<float> RoundOnEveryChunk(uint64_t step, v1::Stream stream, float lr) {
    std::vector<float> mean;
    for (uint32_t c = 0; c < NumChunksOf(shard_); ++c) {
      std::vector<float> m = ExpectRoundCompletes(step, stream, c, lr);
      mean.insert(mean.end(), m.begin(), m.end());
    }
    return mean;
  }
};

TEST_P(ModelUpdateTest, GradRoundAppliesXMinusLrTimesMean) {
  Start(2, GetParam());
  RegisterAll();
  const std::vector<float> x0 = DyadicValues(ShardLen(shard_), rng_);
  InitModel(x0);
  const float lr = 0.25f;
  const std::vector<float> mean = RoundOnEveryChunk(1, v1::GRAD, lr);
  ASSERT_EQ(mean.size(), x0.size());
  std::vector<float> expected(x0.size());
  for (size_t i = 0; i < x0.size(); ++i) expected[i] = x0[i] - lr * mean[i];
  EXPECT_TRUE(PullShard() == expected) << "model after a GRAD round";

  // A second step applies on top of the first.
  const std::vector<float> mean2 = RoundOnEveryChunk(2, v1::GRAD, lr);
  for (size_t i = 0; i < x0.size(); ++i) expected[i] -= lr * mean2[i];
  EXPECT_TRUE(PullShard() == expected) << "model after two GRAD rounds";
}

TEST_P(ModelUpdateTest, ModelRoundSetsTheModel) {
  Start(2, GetParam());
  RegisterAll();
  InitModel(DyadicValues(ShardLen(shard_), rng_));
  const std::vector<float> mean = RoundOnEveryChunk(1, v1::MODEL, 0.25f);
  EXPECT_TRUE(PullShard() == mean) << "model after a MODEL round";
}

INSTANTIATE_TEST_SUITE_P(BothShards, ModelUpdateTest, ::testing::Values(0u, 1u));

TEST_F(ServiceTest, RetriedPushGetsTheSameAnswerAndIsCountedOnce) {
  Start(2, 1);  // shard 1: one chunk
  RegisterAll();
  const std::vector<float> x0 = DyadicValues(ShardLen(1), rng_);
  InitModel(x0);
  const float lr = 0.25f;
  const std::vector<float> weights = WeightsFor(2);
  const std::vector<float> v0 = DyadicValues(ShardLen(1), rng_);
  const std::vector<float> values1 = DyadicValues(ShardLen(1), rng_);
  const v1::PushPullRequest push0 = MakePush(0, 1, v1::GRAD, 0, weights[0], lr, v0);

  auto first = PushPullAsync(push0);
  ASSERT_TRUE(StatusBecomes([](const v1::GetStatusResponse& s) { return s.open_rounds() == 1; }));
  const uint64_t bytes_before = GetStatus().bytes_in();
  auto retry = PushPullAsync(push0);
  ASSERT_TRUE(StatusBecomes([&](const v1::GetStatusResponse& s) {
    return s.bytes_in() >= bytes_before + push0.ByteSizeLong();
  }));
  // Counted twice, rank 0 alone would have completed the round of 2.
  v1::GetStatusResponse status = GetStatus();
  EXPECT_EQ(status.rounds_completed(), 0u);
  EXPECT_EQ(status.open_rounds(), 1u);
  EXPECT_FALSE(first->done.HasBeenNotified());
  EXPECT_FALSE(retry->done.HasBeenNotified());

  v1::PushPullResponse answer1;
  grpc::Status s = PushPull(MakePush(1, 1, v1::GRAD, 0, weights[1], lr, values1), &answer1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(first->WaitDone());
  ASSERT_TRUE(retry->WaitDone());
  ASSERT_TRUE(first->status.ok()) << first->status.error_message();
  ASSERT_TRUE(retry->status.ok()) << retry->status.error_message();

  const std::vector<float> expected = WeightedMean({v0, values1}, weights);
  EXPECT_TRUE(Floats(answer1.mean()) == expected);
  EXPECT_EQ(first->response.mean(), answer1.mean());
  EXPECT_EQ(retry->response.mean(), answer1.mean());

  // A retry after completion is answered from the retained mean.
  v1::PushPullResponse late;
  s = PushPull(push0, &late);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(late.mean(), answer1.mean());

  status = GetStatus();
  EXPECT_EQ(status.rounds_completed(), 1u);
  EXPECT_EQ(status.open_rounds(), 0u);
  // The update was applied once.
  std::vector<float> model(x0.size());
  for (size_t i = 0; i < x0.size(); ++i) model[i] = x0[i] - lr * expected[i];
  EXPECT_TRUE(PullShard() == model);
}

TEST_F(ServiceTest, OverdueRoundFailsNamingTheMissingRanks) {
  ParameterServerService::Options options;
  options.now = [this] { return absl::FromUnixSeconds(fake_now_s_.load()); };
  options.expiry_thread = false;
  Start(3, 0, std::move(options));
  RegisterAll();

  auto pending = PushPullAsync(ValidPush(1));
  ASSERT_TRUE(StatusBecomes([](const v1::GetStatusResponse& s) { return s.open_rounds() == 1; }));
  const absl::Time opened = absl::FromUnixSeconds(fake_now_s_.load());

  EXPECT_EQ(server_->service().ExpireOverdueRounds(opened + absl::Seconds(kTimeoutS - 1)), 0);
  EXPECT_EQ(GetStatus().open_rounds(), 1u);
  EXPECT_FALSE(pending->done.HasBeenNotified());

  fake_now_s_ += kTimeoutS;
  EXPECT_EQ(server_->service().ExpireOverdueRounds(opened + absl::Seconds(kTimeoutS)), 1);
  ASSERT_TRUE(pending->WaitDone());
  EXPECT_EQ(pending->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << pending->status.error_message();
  EXPECT_THAT(pending->status.error_message(),
              AllOf(HasSubstr("missing ranks 1, 2"), HasSubstr("step 1")));

  const v1::GetStatusResponse status = GetStatus();
  EXPECT_EQ(status.rounds_failed(), 1u);
  EXPECT_EQ(status.open_rounds(), 0u);
  // The failed round is forgotten; the same key completes as a new round.
  ExpectRoundCompletes(1, v1::GRAD, 0);
}

// -------------------------------------------------------- PullModel / PushModel

TEST_F(ServiceTest, PullModelWaitsForInitialisation) {
  Start(2);
  RegisterAll();
  auto pull = PullModelAsync(ShardFirst(0) + 10, 100, /*wait_for_init=*/true);
  GetStatus();  // a round trip on the same channel
  EXPECT_FALSE(pull->done.HasBeenNotified()) << "answered before any PushModel";

  const std::vector<float> x0 = DyadicValues(ShardLen(0), rng_);
  const uint64_t first_part = ChunkLen(0, 0);
  v1::PushModelResponse response;
  grpc::Status s = PushModel(
      0, ShardFirst(0),
      Bytes(std::vector<float>(x0.begin(), x0.begin() + first_part)), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(response.shard_initialised());
  GetStatus();
  // The pulled range is written, but the shard is not initialised yet.
  EXPECT_FALSE(pull->done.HasBeenNotified()) << "answered before the shard was initialised";

  s = PushModel(0, ShardFirst(0) + first_part,
                Bytes(std::vector<float>(x0.begin() + first_part, x0.end())), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(response.shard_initialised());

  ASSERT_TRUE(pull->WaitDone());
  ASSERT_TRUE(pull->status.ok()) << pull->status.error_message();
  EXPECT_EQ(pull->response.offset(), ShardFirst(0) + 10);
  EXPECT_THAT(Floats(pull->response.values()),
              ElementsAreArray(x0.begin() + 10, x0.begin() + 110));
  EXPECT_TRUE(GetStatus().model_initialised());
}

TEST_F(ServiceTest, PullModelWaitingForInitRunsIntoItsDeadline) {
  Start(2);
  auto pull = PullModelAsync(0, 4, /*wait_for_init=*/true, std::chrono::milliseconds(300));
  ASSERT_TRUE(pull->WaitDone());
  EXPECT_EQ(pull->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << pull->status.error_message();
}

TEST_F(ServiceTest, PullModelWithoutWaitOnUninitialisedShard) {
  Start(2);
  RegisterAll();
  v1::PullModelResponse response;
  grpc::Status s = PullModel(0, 4, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("shard 0"), HasSubstr("PushModel")));

  // Partly written is still uninitialised.
  v1::PushModelResponse pushed;
  ASSERT_TRUE(PushModel(0, 0, Bytes(std::vector<float>(4, 1.0f)), &pushed).ok());
  EXPECT_FALSE(pushed.shard_initialised());
  s = PullModel(0, 4, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  ExpectRoundCompletes(1);
}

TEST_F(ServiceTest, PushModelAndPullModelRefusals) {
  Start(2, 1);
  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(0, "w0", &registered).ok());
  const std::vector<float> x0 = DyadicValues(ShardLen(1), rng_);
  InitModel(x0);

  v1::PushModelResponse pushed;
  // Not registered.
  grpc::Status s = PushModel(1, ShardFirst(1), Bytes({1.0f}), &pushed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("rank 1"));
  // Not whole floats.
  s = PushModel(0, ShardFirst(1), "12345", &pushed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("5 bytes"));
  // Shard 0's floats.
  s = PushModel(0, ShardFirst(1) - 2, Bytes({1.0f, 2.0f, 3.0f}), &pushed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("PushModel"), HasSubstr(absl::StrCat(ShardFirst(1)))));

  v1::PullModelResponse pulled;
  s = PullModel(kD - 2, 3, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat(kD)));
  // An offset near 2^64: the message names it and the count as sent.
  s = PullModel(UINT64_MAX, 2, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("from ", UINT64_MAX, ", count 2,")));
  s = PullModel(ShardFirst(1), ChunkFloats(kMaxMessageBytes) + 1, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("max_message_bytes"));
  s = PullModel(ShardFirst(1), 4, &pulled, /*fingerprint_delta=*/1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("fingerprint"));

  // None of the refusals changed the model.
  EXPECT_TRUE(PullShard() == x0);
}

// --------------------------------------------------------- Status, shutdown

TEST_F(ServiceTest, GetStatusCountsRoundsAndMembers) {
  Start(2);
  v1::GetStatusResponse status = GetStatus();
  EXPECT_EQ(status.world_size(), 2u);
  EXPECT_EQ(status.registered(), 0u);
  EXPECT_EQ(status.rounds_completed(), 0u);
  EXPECT_FALSE(status.model_initialised());
  EXPECT_EQ(status.fingerprint(), fingerprint_);
  EXPECT_EQ(status.shard().first_float(), ShardFirst(0));
  EXPECT_EQ(status.shard().end_float(), ShardEnd(0));

  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(-1, "w0", &registered).ok());
  EXPECT_EQ(GetStatus().registered(), 1u);
  ASSERT_TRUE(Register(-1, "w1", &registered).ok());
  ASSERT_TRUE(Register(-1, "w0", &registered).ok());  // a retry
  EXPECT_EQ(GetStatus().registered(), 2u);

  InitModel(DyadicValues(ShardLen(0), rng_));
  ExpectRoundCompletes(1, v1::GRAD, 0);
  ExpectRoundCompletes(1, v1::GRAD, 1);
  ExpectRoundCompletes(2, v1::MODEL, 0);
  status = GetStatus();
  EXPECT_EQ(status.rounds_completed(), 3u);
  EXPECT_EQ(status.rounds_failed(), 0u);
  EXPECT_EQ(status.open_rounds(), 0u);
  EXPECT_EQ(status.newest_step(), 2u);
  EXPECT_TRUE(status.model_initialised());
  EXPECT_GT(status.bytes_in(), 3 * 2 * ChunkLen(0, 1) * sizeof(float));
  EXPECT_GT(status.bytes_out(), 0u);
}

// A member may keep only so many calls waiting on a shard: pushes sent
// again and again without waiting for their answers are refused once the
// bound is reached, and those already waiting are answered as usual.
TEST_F(ServiceTest, AMemberMayKeepOnlySoManyPushesWaiting) {
  Start(2);
  RegisterAll();
  const BlockLayout& layout = server_->service().layout();
  const uint32_t bound =
      MaxWaitingCallsPerRank(layout.ShardSize(shard_), ChunkFloats(config_.cluster()));
  // One more than the bound: the round waits for rank 1, so no push is
  // answered but the one refused.
  std::vector<std::shared_ptr<AsyncPush>> calls;
  for (uint32_t i = 0; i <= bound; ++i) calls.push_back(PushPullAsync(ValidPush()));
  std::shared_ptr<AsyncPush> refused = FirstAnswered(calls);
  ASSERT_NE(refused, nullptr) << "no push was refused";
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused->status.error_message();
  EXPECT_THAT(refused->status.error_message(),
              HasSubstr(absl::StrCat("already has ", bound, " calls waiting")));
  int answered = 0;
  for (const auto& call : calls) answered += call->done.HasBeenNotified();
  EXPECT_EQ(answered, 1);

  v1::PushPullRequest other = ValidPush();
  other.set_rank(1);
  v1::PushPullResponse response;
  ASSERT_TRUE(PushPull(other, &response).ok());
  for (const auto& call : calls) {
    if (call == refused) continue;
    ASSERT_TRUE(call->WaitDone());
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
  }
}

// PullModel names no rank, so the calls waiting for the model are bounded
// per shard; a call that gave up no longer counts.
TEST_F(ServiceTest, OnlySoManyPullModelCallsMayWaitForTheModel) {
  Start(2);
  RegisterAll();
  const BlockLayout& layout = server_->service().layout();
  const uint32_t bound = MaxModelWaiters(config_.cluster().num_workers(),
                                         layout.ShardSize(shard_), ChunkFloats(config_.cluster()));
  std::vector<std::shared_ptr<AsyncPull>> calls;
  for (uint32_t i = 0; i <= bound; ++i) {
    calls.push_back(PullModelAsync(ShardFirst(shard_), 4, /*wait_for_init=*/true));
  }
  std::shared_ptr<AsyncPull> refused = FirstAnswered(calls);
  ASSERT_NE(refused, nullptr) << "no PullModel was refused";
  EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused->status.error_message();
  EXPECT_THAT(refused->status.error_message(),
              HasSubstr(absl::StrCat(bound, " calls already wait for this shard's model")));
  int answered = 0;
  for (const auto& call : calls) answered += call->done.HasBeenNotified();
  EXPECT_EQ(answered, 1);

  // Every waiting caller gives up; a new call then waits (is not refused)
  // once the server has seen a cancellation, which reaches it a little
  // after the client's.
  for (const auto& call : calls) call->context.TryCancel();
  for (const auto& call : calls) ASSERT_TRUE(call->WaitDone());
  std::shared_ptr<AsyncPull> parked;
  const absl::Time limit = absl::Now() + absl::Seconds(20);
  for (int attempt = 0; attempt < 100000 && parked == nullptr && absl::Now() < limit;
       ++attempt) {
    // A refusal is answered at once, but under TSan on a busy machine that
    // can take a few hundred ms; only the parked call waits the whole time.
    auto call = PullModelAsync(ShardFirst(shard_), 4, /*wait_for_init=*/true);
    if (!call->done.WaitForNotificationWithTimeout(absl::Seconds(3))) {
      parked = call;
    } else {
      ASSERT_EQ(call->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << call->status.error_message();
    }
  }
  ASSERT_NE(parked, nullptr) << "the calls that gave up still fill the shard's waiters";
  const std::vector<float> x0 = DyadicValues(ShardLen(shard_), rng_);
  InitModel(x0);
  ASSERT_TRUE(parked->WaitDone());
  ASSERT_TRUE(parked->status.ok()) << parked->status.error_message();
  EXPECT_EQ(parked->response.values(),
            Bytes(std::vector<float>(x0.begin(), x0.begin() + 4)));
}

// A message over cluster.max_message_bytes is refused by gRPC before the
// service sees it (docs/protocol.md 2), and the shard holds nothing of it.
TEST_F(ServiceTest, OversizedMessageIsRefusedByGrpc) {
  Start(2);
  RegisterAll();
  v1::PushPullRequest request = ValidPush();
  request.set_values(std::string(kMaxMessageBytes + 4, '\0'));
  v1::PushPullResponse response;
  grpc::Status s = PushPull(request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(GetStatus().open_rounds(), 0u);
}

// gRPC answers a body that does not parse as the method's request before
// any handler runs (docs/protocol.md 8): the code is pinned here so that the
// document follows if a gRPC version changes it. Nothing is counted.
TEST_F(ServiceTest, UnparsableRequestBodyIsRefusedByGrpc) {
  Start(2);
  RegisterAll();
  grpc::GenericStub generic(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  const char garbage[] = "\xff\xff\xff\xff\xff";  // a field tag whose varint never ends
  grpc::Slice slice(garbage, sizeof(garbage) - 1);
  grpc::ByteBuffer request(&slice, 1);
  for (const char* method : {"/cserps.v1.ParameterServer/PushPull",
                             "/cserps.v1.ParameterServer/Register"}) {
    SCOPED_TRACE(method);
    grpc::ByteBuffer reply;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &reply,
                      [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    EXPECT_EQ(status.error_message(), "");
  }
  EXPECT_EQ(GetStatus().open_rounds(), 0u);
  EXPECT_EQ(GetStatus().members(), 2u);
}

TEST_F(ServiceTest, ShutdownAnswersParkedCallsUnavailable) {
  Start(2);
  RegisterAll();
  auto push = PushPullAsync(ValidPush(1));
  auto pull = PullModelAsync(0, 4, /*wait_for_init=*/true);
  ASSERT_TRUE(StatusBecomes([](const v1::GetStatusResponse& s) { return s.open_rounds() == 1; }));
  GetStatus();
  EXPECT_FALSE(push->done.HasBeenNotified());
  EXPECT_FALSE(pull->done.HasBeenNotified());

  server_->Shutdown();
  ASSERT_TRUE(push->WaitDone());
  ASSERT_TRUE(pull->WaitDone());
  EXPECT_EQ(push->status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << push->status.error_message();
  EXPECT_THAT(push->status.error_message(), HasSubstr("shutting down"));
  EXPECT_EQ(pull->status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << pull->status.error_message();
}

// When ParameterServerService::Create or BuildAndStart fails, the half-built
// PsServer is destroyed, and its Shutdown must not touch the services it
// never made. Run in a child process so that a crash there does not take the
// other tests down.
// The services' clock only measures durations; a steady clock keeps a step
// of the wall clock (a resumed VM, NTP) out of every round's timeout.
TEST(ServiceClockTest, TheRealClockIsTheSteadyClock) {
  const absl::Duration steady =
      absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  EXPECT_LT(absl::AbsDuration((RealNow() - absl::UnixEpoch()) - steady), absl::Seconds(1));
}

TEST(PsServerStartDeathTest, BadShardIsAnErrorNotACrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const v1::JobConfig config = MakeConfig(2);
  EXPECT_EXIT(
      {
        absl::StatusOr<std::unique_ptr<PsServer>> server =
            PsServer::Start(config, /*shard=*/2, "127.0.0.1:0");
        const bool ok = !server.ok() &&
                        server.status().code() == absl::StatusCode::kInvalidArgument &&
                        absl::StrContains(server.status().message(), "shard 2");
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A second shard on a port in use fails to start, where gRPC's default
// (SO_REUSEPORT) let both listen and split the connections between them.
TEST(PsServerStartTest, APortInUseIsRefused) {
  const v1::JobConfig config = MakeConfig(2);
  absl::StatusOr<std::unique_ptr<PsServer>> first = PsServer::Start(config, 0, "127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<PsServer>> second =
      PsServer::Start(config, 1, (*first)->address());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("address in use"));
  if (second.ok()) (*second)->Shutdown();
  (*first)->Shutdown();
}

// A model this machine cannot hold (validation bounds it at 2^40 floats,
// what a number can say) is refused by name, where the allocation aborted
// the process (4 TiB: more than any machine this runs on).
TEST(PsServerStartTest, AModelBeyondMemoryIsRefusedNotACrash) {
  v1::JobConfig config = MakeConfig(1);
  config.mutable_model()->Clear();
  config.mutable_model()->set_kind(v1::ModelConfig::FLAT);
  config.mutable_model()->set_num_params(uint64_t{1} << 40);
  ApplyDefaults(&config);
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(config, 0, "127.0.0.1:0");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kResourceExhausted) << server.status();
  EXPECT_THAT(server.status().message(), HasSubstr("model.num_params"));
  if (server.ok()) (*server)->Shutdown();
}

TEST(PsServerStartDeathTest, UnusableAddressIsAnErrorNotACrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const v1::JobConfig config = MakeConfig(2);
  EXPECT_EXIT(
      {
        absl::StatusOr<std::unique_ptr<PsServer>> server =
            PsServer::Start(config, 0, "999.999.999.999:1");
        const bool ok = !server.ok() &&
                        server.status().code() == absl::StatusCode::kUnavailable &&
                        absl::StrContains(server.status().message(), "999.999.999.999:1");
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace cserps
