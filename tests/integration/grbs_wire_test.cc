// GRBS on the wire, through a real in-process cluster (2 shards on
// 127.0.0.1): the servers and the workers select the same floats for a
// round, the bytes on the wire are the selected floats and little else, and
// rounds the job does not use are refused without disturbing the ones it
// does.
//
// Expectations are computed here from the documented rules (block layout in
// common/block_layout.h, model size in common/model_spec.h, selection by
// SelectBlocks, which tests/common/grbs_test.cc pins to reference vectors),
// never from BlockLayout or ShardPayload, so a layout or scatter bug on
// either side shows up.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_layout.h"
#include "common/config.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;
using testing::InProcessCluster;
using testing::TestConfig;

constexpr uint64_t kSeed = 4242;
constexpr uint32_t kShards = 2;
constexpr uint64_t kClasses = 10;
constexpr uint32_t kMaxMessageBytes = 64 * 1024;
// Far enough for the step searches below; the round table refuses steps
// more than this far ahead of the newest completed one.
constexpr uint32_t kMaxStepLag = 1000;

// A SOFTMAX model input_dim -> 10 has d = input_dim * 10 + 10 floats.
uint64_t ModelSize(uint64_t input_dim) { return input_dim * kClasses + kClasses; }

// `algorithm` is the body of the algorithm message.
v1::JobConfig MakeConfig(uint32_t workers, uint64_t input_dim,
                         const std::string& algorithm) {
  return TestConfig(absl::StrCat(R"pb(
    name: "grbs-wire-test"
    seed: )pb", kSeed, R"pb(
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: )pb", workers, R"pb(
      max_message_bytes: )pb", kMaxMessageBytes, R"pb(
      round_timeout_s: 10
      max_step_lag: )pb", kMaxStepLag, R"pb(
    }
    model { kind: SOFTMAX input_dim: )pb", input_dim, R"pb( num_classes: 10 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 }
    algorithm { )pb", algorithm, R"pb( }
    epochs: 1
  )pb"));
}

std::unique_ptr<InProcessCluster> StartCluster(const v1::JobConfig& config,
                                               uint64_t d) {
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(config, d);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

// The floats one round covers, by the rules of block_layout.h: blocks of
// `block` floats (the last one shorter), shard s owning blocks
// [s*ceil(B/S), (s+1)*ceil(B/S)).
struct Selection {
  std::vector<uint64_t> blocks;
  std::vector<char> covers;           // per float: whether the round carries it
  std::vector<uint64_t> shard_floats;  // floats carried per shard
  uint64_t floats = 0;
  bool has_short_last_block = false;
};

Selection Select(v1::Stream stream, uint64_t step, uint32_t ratio, uint64_t d,
                 uint64_t block) {
  const uint64_t num_blocks = (d + block - 1) / block;
  const uint64_t blocks_per_shard = (num_blocks + kShards - 1) / kShards;
  Selection s;
  s.blocks = SelectBlocks(kSeed, stream, step, ratio, num_blocks);
  s.covers.assign(d, 0);
  s.shard_floats.assign(kShards, 0);
  for (uint64_t b : s.blocks) {
    const uint64_t begin = b * block;
    const uint64_t end = std::min(d, begin + block);
    for (uint64_t j = begin; j < end; ++j) s.covers[j] = 1;
    s.shard_floats[b / blocks_per_shard] += end - begin;
    s.floats += end - begin;
    if (end - begin < block) s.has_short_last_block = true;
  }
  return s;
}

// The first step whose selection includes the model's short last block, so
// that the test covers it.
uint64_t StepSelectingLastBlock(v1::Stream stream, uint32_t ratio, uint64_t d,
                                uint64_t block) {
  for (uint64_t t = 0; t < kMaxStepLag; ++t) {
    if (Select(stream, t, ratio, d, block).has_short_last_block) return t;
  }
  ADD_FAILURE() << "no step up to " << kMaxStepLag << " selects the last block";
  return 0;
}

// Multiples of 1/8 in [-8, 8]: with weights summing to 4 and lr 0.25 every
// mean and update below is exact in float, whatever the summation order.
std::vector<float> DyadicValues(uint64_t n, uint64_t key) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng.Below(129)) - 64) / 8.0f;
  return v;
}

// Unequal, summing to 4 (see DyadicValues): an unweighted mean would differ.
constexpr float kWeights[] = {1.0f, 2.0f, 1.0f};

std::vector<float> WeightedMean(const std::vector<std::vector<float>>& values) {
  std::vector<float> mean(values[0].size());
  for (size_t j = 0; j < mean.size(); ++j) {
    double sum = 0, total = 0;
    for (size_t r = 0; r < values.size(); ++r) {
      sum += double{kWeights[r]} * values[r][j];
      total += kWeights[r];
    }
    mean[j] = static_cast<float>(sum / total);
  }
  return mean;
}

// "" when `got` equals `want`, else the first differing float, whether the
// round selected it, and how many differ.
std::string Difference(const std::vector<float>& got, const std::vector<float>& want,
                       const Selection& selection) {
  if (got.size() != want.size()) {
    return absl::StrCat("sizes ", got.size(), " and ", want.size());
  }
  uint64_t differing = 0, first = 0;
  for (uint64_t j = 0; j < got.size(); ++j) {
    if (std::memcmp(&got[j], &want[j], sizeof(float)) != 0 && differing++ == 0) first = j;
  }
  if (differing == 0) return "";
  return absl::StrCat(differing, " floats differ; the first is float ", first,
                      " (", selection.covers[first] ? "selected" : "not selected",
                      "): got ", got[first], ", want ", want[first]);
}

std::vector<float> PullServersModel(InProcessCluster& cluster, uint64_t d) {
  std::vector<float> model(d);
  absl::Status s = cluster.client(0).PullModel(absl::MakeSpan(model), false);
  EXPECT_TRUE(s.ok()) << s;
  return model;
}

// ---------------------------------------------------------------------------
// 1. The same selection on the worker and the server paths.

// SOFTMAX 30000 -> 10: d = 300010 floats in 1172 blocks of 256 (the last 234
// floats). At ratio 8 a round carries 147 blocks, about 18.8k floats per
// shard: more than one 64 KiB chunk.
constexpr uint64_t kSelectInputDim = 30000;
constexpr uint64_t kSelectBlock = 256;
constexpr uint32_t kSelectRatio = 8;
constexpr uint32_t kSelectWorkers = 3;

TEST(GrbsWireTest, ModelRoundSetsTheMeanOnExactlyTheSelectedFloats) {
  const uint64_t d = ModelSize(kSelectInputDim);
  const v1::JobConfig config = MakeConfig(
      kSelectWorkers, kSelectInputDim,
      absl::StrCat("name: \"csea\" block_size: ", kSelectBlock,
                   " ratio_c1: ", kSelectRatio));
  std::unique_ptr<InProcessCluster> cluster = StartCluster(config, d);
  ASSERT_NE(cluster, nullptr);

  const uint64_t step = StepSelectingLastBlock(v1::MODEL, kSelectRatio, d, kSelectBlock);
  const Selection selection = Select(v1::MODEL, step, kSelectRatio, d, kSelectBlock);
  ASSERT_GT(selection.shard_floats[0], 0u);
  ASSERT_GT(selection.shard_floats[1], 0u);
  ASSERT_GT(std::max(selection.shard_floats[0], selection.shard_floats[1]),
            ChunkFloats(kMaxMessageBytes))
      << "a shard's payload should span several chunks";

  const std::vector<float> x0 = DyadicValues(d, 1);
  const absl::Status pushed = cluster->client(0).PushModel(x0);
  ASSERT_TRUE(pushed.ok()) << pushed;

  std::vector<std::vector<float>> x;
  for (uint32_t r = 0; r < kSelectWorkers; ++r) x.push_back(DyadicValues(d, 100 + r));
  const std::vector<std::vector<float>> before = x;
  const std::vector<float> mean = WeightedMean(x);

  // In place (values and mean the same buffer), as the algorithms call it.
  const absl::Status averaged = cluster->OnEveryRank([&](int r) {
    return cluster->client(r).AverageBlocks(v1::MODEL, step, kSelectRatio, x[r],
                                            kWeights[r], /*lr=*/0, absl::MakeSpan(x[r]));
  });
  ASSERT_TRUE(averaged.ok()) << averaged;

  std::vector<float> want_server(d);
  for (uint64_t j = 0; j < d; ++j) want_server[j] = selection.covers[j] ? mean[j] : x0[j];
  EXPECT_EQ(Difference(PullServersModel(*cluster, d), want_server, selection), "")
      << "servers' model after MODEL step " << step << " at ratio " << kSelectRatio;
  for (uint32_t r = 0; r < kSelectWorkers; ++r) {
    std::vector<float> want(d);
    for (uint64_t j = 0; j < d; ++j) want[j] = selection.covers[j] ? mean[j] : before[r][j];
    EXPECT_EQ(Difference(x[r], want, selection), "") << "rank " << r << "'s buffer";
  }
}

TEST(GrbsWireTest, GradRoundAppliesTheStepOnExactlyTheSelectedFloats) {
  const uint64_t d = ModelSize(kSelectInputDim);
  const v1::JobConfig config = MakeConfig(
      kSelectWorkers, kSelectInputDim,
      absl::StrCat("name: \"ef-sgd\" block_size: ", kSelectBlock, " ratio: ", kSelectRatio));
  std::unique_ptr<InProcessCluster> cluster = StartCluster(config, d);
  ASSERT_NE(cluster, nullptr);

  const uint64_t step = StepSelectingLastBlock(v1::GRAD, kSelectRatio, d, kSelectBlock);
  const Selection selection = Select(v1::GRAD, step, kSelectRatio, d, kSelectBlock);
  // The GRAD and MODEL streams draw different blocks for the same step, so
  // a side that mixed them up would disagree here.
  ASSERT_NE(selection.blocks, Select(v1::MODEL, step, kSelectRatio, d, kSelectBlock).blocks);

  const std::vector<float> x0 = DyadicValues(d, 1);
  const absl::Status pushed = cluster->client(0).PushModel(x0);
  ASSERT_TRUE(pushed.ok()) << pushed;

  std::vector<std::vector<float>> g;
  for (uint32_t r = 0; r < kSelectWorkers; ++r) g.push_back(DyadicValues(d, 200 + r));
  const std::vector<float> mean = WeightedMean(g);
  // Outside the dyadic range, so a write outside the selection shows.
  constexpr float kUntouched = 1000.0f;
  std::vector<std::vector<float>> out(kSelectWorkers, std::vector<float>(d, kUntouched));
  constexpr float kLr = 0.25f;

  const absl::Status averaged = cluster->OnEveryRank([&](int r) {
    return cluster->client(r).AverageBlocks(v1::GRAD, step, kSelectRatio, g[r],
                                            kWeights[r], kLr, absl::MakeSpan(out[r]));
  });
  ASSERT_TRUE(averaged.ok()) << averaged;

  std::vector<float> want_server(d);
  for (uint64_t j = 0; j < d; ++j) {
    want_server[j] = selection.covers[j]
                         ? static_cast<float>(double{x0[j]} - double{kLr} * mean[j])
                         : x0[j];
  }
  EXPECT_EQ(Difference(PullServersModel(*cluster, d), want_server, selection), "")
      << "servers' model after GRAD step " << step << " at ratio " << kSelectRatio;
  std::vector<float> want_mean(d);
  for (uint64_t j = 0; j < d; ++j) want_mean[j] = selection.covers[j] ? mean[j] : kUntouched;
  for (uint32_t r = 0; r < kSelectWorkers; ++r) {
    EXPECT_EQ(Difference(out[r], want_mean, selection), "") << "rank " << r << "'s mean";
  }
}

// ---------------------------------------------------------------------------
// 2. The bytes on the wire.

// SOFTMAX 20000 -> 10: d = 200010 floats in 196 blocks of 1024 (the last 330
// floats). Ratio 32 carries 6 blocks; ratio 1 cuts each shard into 7 chunks.
constexpr uint64_t kWireInputDim = 20000;
constexpr uint64_t kWireBlock = 1024;
constexpr uint32_t kWireRatio = 32;
constexpr uint32_t kWireWorkers = 3;
// A PushPull request's fields other than its values (fingerprint, rank,
// step, stream, ratio, chunk, weight, lr and the values' tag and length)
// take at most 11+6+11+2+6+6+5+5+6 bytes; a reply's (step, stream, chunk,
// the mean's tag and length) at most 11+2+6+6.
constexpr uint64_t kMaxRequestHeader = 58;
constexpr uint64_t kMaxReplyHeader = 25;

struct Traffic {
  std::vector<v1::StreamTraffic> shards[3];  // by stream, then shard
  std::vector<TrafficCounts> ranks[3];
};

Traffic Measure(InProcessCluster& cluster) {
  Traffic t;
  for (v1::Stream stream : {v1::GRAD, v1::MODEL}) {
    for (uint32_t s = 0; s < kShards; ++s) {
      absl::StatusOr<v1::GetStatusResponse> status = cluster.client(0).GetStatus(s);
      EXPECT_TRUE(status.ok()) << status.status();
      v1::StreamTraffic found;
      int matches = 0;
      if (status.ok()) {
        for (const v1::StreamTraffic& st : status->streams()) {
          if (st.stream() == stream) {
            found = st;
            ++matches;
          }
        }
      }
      EXPECT_EQ(matches, 1) << "shard " << s << " reports stream " << stream
                            << " " << matches << " times";
      t.shards[stream].push_back(found);
    }
    for (int r = 0; r < cluster.num_workers(); ++r) {
      t.ranks[stream].push_back(cluster.client(r).traffic(stream));
    }
  }
  return t;
}

// Checks the traffic between `before` and `after`, one round of every rank
// on `stream` covering `selection`.
void ExpectRoundTraffic(const Traffic& before, const Traffic& after,
                        v1::Stream stream, const Selection& selection) {
  const uint64_t n = kWireWorkers;
  const uint64_t chunk_floats = ChunkFloats(kMaxMessageBytes);
  uint64_t server_in = 0, server_out = 0, client_pushed = 0, client_pulled = 0;
  for (uint32_t s = 0; s < kShards; ++s) {
    SCOPED_TRACE(absl::StrCat("shard ", s));
    const v1::StreamTraffic& b = before.shards[stream][s];
    const v1::StreamTraffic& a = after.shards[stream][s];
    const uint64_t floats = selection.shard_floats[s];
    const uint64_t rpcs = n * NumChunks(floats, chunk_floats);
    EXPECT_EQ(a.floats_in() - b.floats_in(), n * floats);
    const uint64_t in = a.bytes_in() - b.bytes_in();
    EXPECT_GE(in, n * floats * sizeof(float));
    EXPECT_LE(in, n * floats * sizeof(float) + rpcs * kMaxRequestHeader);
    const uint64_t out = a.bytes_out() - b.bytes_out();
    EXPECT_GE(out, n * floats * sizeof(float));
    EXPECT_LE(out, n * floats * sizeof(float) + rpcs * kMaxReplyHeader);
    server_in += in;
    server_out += out;
    // Nothing on the other stream.
    const v1::Stream other = stream == v1::GRAD ? v1::MODEL : v1::GRAD;
    EXPECT_EQ(after.shards[other][s].bytes_in(), before.shards[other][s].bytes_in());
    EXPECT_EQ(after.shards[other][s].floats_in(), before.shards[other][s].floats_in());
  }
  const double payload_bytes = static_cast<double>(n * selection.floats * sizeof(float));
  EXPECT_NEAR(static_cast<double>(server_in), payload_bytes, 0.01 * payload_bytes);
  for (uint32_t r = 0; r < n; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const TrafficCounts& b = before.ranks[stream][r];
    const TrafficCounts& a = after.ranks[stream][r];
    EXPECT_EQ(a.request_floats - b.request_floats, selection.floats);
    client_pushed += a.request_bytes - b.request_bytes;
    client_pulled += a.reply_bytes - b.reply_bytes;
  }
  // Both sides count the serialized messages, so they agree to the byte.
  EXPECT_EQ(client_pushed, server_in);
  EXPECT_EQ(client_pulled, server_out);
}

TEST(GrbsWireTest, WireBytesAreTheSelectedFloats) {
  const uint64_t d = ModelSize(kWireInputDim);
  ASSERT_GE(d, 100000u);
  const v1::JobConfig config = MakeConfig(
      kWireWorkers, kWireInputDim,
      absl::StrCat("name: \"csea\" block_size: ", kWireBlock, " ratio_c1: ", kWireRatio));
  std::unique_ptr<InProcessCluster> cluster = StartCluster(config, d);
  ASSERT_NE(cluster, nullptr);
  ASSERT_TRUE(cluster->client(0).PushModel(DyadicValues(d, 1)).ok());

  std::vector<std::vector<float>> x;
  for (uint32_t r = 0; r < kWireWorkers; ++r) x.push_back(DyadicValues(d, 300 + r));
  auto round = [&](uint64_t step, uint32_t ratio) {
    return cluster->OnEveryRank([&](int r) {
      return cluster->client(r).AverageBlocks(v1::MODEL, step, ratio, x[r], kWeights[r],
                                              /*lr=*/0, absl::MakeSpan(x[r]));
    });
  };

  const uint64_t step = StepSelectingLastBlock(v1::MODEL, kWireRatio, d, kWireBlock);
  {
    SCOPED_TRACE(absl::StrCat("ratio ", kWireRatio, " step ", step));
    const Selection selection = Select(v1::MODEL, step, kWireRatio, d, kWireBlock);
    ASSERT_EQ(selection.blocks.size(), 6u);  // round(196 / 32)
    const Traffic before = Measure(*cluster);
    const absl::Status averaged = round(step, kWireRatio);
    ASSERT_TRUE(averaged.ok()) << averaged;
    ExpectRoundTraffic(before, Measure(*cluster), v1::MODEL, selection);
  }
  {
    SCOPED_TRACE("ratio 1");
    const Selection selection = Select(v1::MODEL, step + 1, 1, d, kWireBlock);
    ASSERT_EQ(selection.floats, d);
    const Traffic before = Measure(*cluster);
    const absl::Status averaged = round(step + 1, 1);
    ASSERT_TRUE(averaged.ok()) << averaged;
    ExpectRoundTraffic(before, Measure(*cluster), v1::MODEL, selection);
  }
}

// ---------------------------------------------------------------------------
// 3. Refusals, through a raw stub of shard 0.

// SOFTMAX 3000 -> 10: d = 30010 floats in 118 blocks of 256; shard 0 owns 59
// blocks (15104 floats), one chunk even at ratio 1.
constexpr uint64_t kRefuseInputDim = 3000;
constexpr uint64_t kRefuseBlock = 256;
constexpr uint32_t kRefuseWorkers = 2;

class RefusalTest : public ::testing::Test {
 protected:
  // `algorithm` is the body of the algorithm message; rounds of the job use
  // (job_stream, job_ratio).
  void Start(const std::string& algorithm, v1::Stream job_stream, uint32_t job_ratio) {
    d_ = ModelSize(kRefuseInputDim);
    job_stream_ = job_stream;
    job_ratio_ = job_ratio;
    const v1::JobConfig config = MakeConfig(
        kRefuseWorkers, kRefuseInputDim,
        absl::StrCat(algorithm, " block_size: ", kRefuseBlock));
    cluster_ = StartCluster(config, d_);
    ASSERT_NE(cluster_, nullptr);
    ASSERT_EQ(Select(v1::MODEL, 0, 1, d_, kRefuseBlock).shard_floats[0], 15104u);
    ASSERT_LT(15104u, ChunkFloats(kMaxMessageBytes));
    fingerprint_ = JobFingerprint(cluster_->config());
    stub_ = v1::ParameterServer::NewStub(grpc::CreateChannel(
        cluster_->config().cluster().servers(0), grpc::InsecureChannelCredentials()));
    // The stub speaks for rank 0: the same worker id gets the same rank.
    v1::RegisterRequest request;
    *request.mutable_config() = cluster_->config();
    request.set_requested_rank(0);
    request.set_worker_id("test-worker-0");
    v1::RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub_->Register(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(response.rank(), 0u);
    ASSERT_TRUE(cluster_->client(0).PushModel(DyadicValues(d_, 1)).ok());
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  // A push from rank 0 to shard 0 of `floats` zeros.
  v1::PushPullRequest Push(v1::Stream stream, uint64_t step, uint32_t ratio,
                           uint64_t floats) const {
    v1::PushPullRequest request;
    request.set_fingerprint(fingerprint_);
    request.set_rank(0);
    request.set_step(step);
    request.set_stream(stream);
    request.set_ratio(ratio);
    request.set_chunk(0);
    request.set_weight(1.0f);
    request.set_lr(0.0f);
    request.set_values(std::string(floats * sizeof(float), '\0'));
    return request;
  }

  // Shard 0's floats of a (stream, step, ratio) round: the right length for
  // its chunk 0 (one chunk, see above).
  uint64_t Shard0Floats(v1::Stream stream, uint64_t step, uint32_t ratio) const {
    return Select(stream, step, ratio, d_, kRefuseBlock).shard_floats[0];
  }

  v1::GetStatusResponse ShardStatus() {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetStatusResponse response;
    const grpc::Status s = stub_->GetStatus(&context, v1::GetStatusRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  static uint64_t FloatsIn(const v1::GetStatusResponse& status) {
    uint64_t floats = 0;
    for (const v1::StreamTraffic& st : status.streams()) floats += st.floats_in();
    return floats;
  }

  // Every rank averages on (stream, next step, ratio) through its client;
  // the servers' model must then hold the mean on the selected floats.
  void ExpectRoundCompletes(v1::Stream stream, uint32_t ratio) {
    const uint64_t step = next_step_++;
    SCOPED_TRACE(absl::StrCat("round at step ", step, " ratio ", ratio));
    std::vector<std::vector<float>> x;
    for (uint32_t r = 0; r < kRefuseWorkers; ++r) x.push_back(DyadicValues(d_, 400 + 10 * step + r));
    const std::vector<float> mean = WeightedMean(x);
    const std::vector<float> model = PullServersModel(*cluster_, d_);
    const absl::Status s = cluster_->OnEveryRank([&](int r) {
      return cluster_->client(r).AverageBlocks(stream, step, ratio, x[r], kWeights[r],
                                               /*lr=*/0, absl::MakeSpan(x[r]));
    });
    ASSERT_TRUE(s.ok()) << s;
    if (stream == v1::MODEL) {
      const Selection selection = Select(stream, step, ratio, d_, kRefuseBlock);
      std::vector<float> want(d_);
      for (uint64_t j = 0; j < d_; ++j) want[j] = selection.covers[j] ? mean[j] : model[j];
      EXPECT_EQ(Difference(PullServersModel(*cluster_, d_), want, selection), "");
    }
  }

  // Sends `request` (for the next step) and expects `code` with every
  // fragment in the message; the refusal must leave no round open and count
  // no traffic, and a valid round of the job on that very step completes.
  void ExpectRefused(const v1::PushPullRequest& request, grpc::StatusCode code,
                     const std::vector<std::string>& fragments) {
    ASSERT_EQ(request.step(), next_step_);
    const uint64_t floats_before = FloatsIn(ShardStatus());
    v1::PushPullResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const grpc::Status s = stub_->PushPull(&context, request, &response);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    for (const std::string& f : fragments) EXPECT_THAT(s.error_message(), HasSubstr(f));
    const v1::GetStatusResponse after = ShardStatus();
    EXPECT_EQ(after.open_rounds(), 0u) << "a refused push opened a round";
    EXPECT_EQ(FloatsIn(after), floats_before) << "a refused push was counted";
    ExpectRoundCompletes(job_stream_, job_ratio_);
    EXPECT_EQ(ShardStatus().rounds_failed(), 0u);
  }

  uint64_t d_ = 0;
  v1::Stream job_stream_ = v1::MODEL;
  uint32_t job_ratio_ = 1;
  uint64_t next_step_ = 0;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<InProcessCluster> cluster_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

TEST_F(RefusalTest, CseaRefusesRatiosItDoesNotUse) {
  ASSERT_NO_FATAL_FAILURE(Start("name: \"csea\" ratio_c1: 8", v1::MODEL, 8));
  ExpectRoundCompletes(v1::MODEL, 8);

  SCOPED_TRACE("MODEL at ratio 4");
  ExpectRefused(Push(v1::MODEL, next_step_, 4, Shard0Floats(v1::MODEL, next_step_, 4)),
                grpc::StatusCode::FAILED_PRECONDITION,
                {"ratio 4", "MODEL at ratio 8", "rank 0"});
}

TEST_F(RefusalTest, CseaRefusesTheGradStream) {
  ASSERT_NO_FATAL_FAILURE(Start("name: \"csea\" ratio_c1: 8", v1::MODEL, 8));
  ExpectRefused(Push(v1::GRAD, next_step_, 8, Shard0Floats(v1::GRAD, next_step_, 8)),
                grpc::StatusCode::FAILED_PRECONDITION,
                {"stream GRAD", "MODEL at ratio 8"});
}

TEST_F(RefusalTest, RatioZeroIsInvalid) {
  ASSERT_NO_FATAL_FAILURE(Start("name: \"csea\" ratio_c1: 8", v1::MODEL, 8));
  ExpectRefused(Push(v1::MODEL, next_step_, 0, Shard0Floats(v1::MODEL, next_step_, 1)),
                grpc::StatusCode::INVALID_ARGUMENT, {"ratio"});
}

TEST_F(RefusalTest, PayloadOfRatioOneUnderRatioEightIsInvalid) {
  ASSERT_NO_FATAL_FAILURE(Start("name: \"csea\" ratio_c1: 8", v1::MODEL, 8));
  const uint64_t got = Shard0Floats(v1::MODEL, next_step_, 1);
  const uint64_t expected = Shard0Floats(v1::MODEL, next_step_, 8);
  ASSERT_NE(got, expected);
  ExpectRefused(Push(v1::MODEL, next_step_, 8, got), grpc::StatusCode::INVALID_ARGUMENT,
                {absl::StrCat("expected ", expected),
                 absl::StrCat("got ", got * sizeof(float), " bytes")});
}

TEST_F(RefusalTest, ModelAtRatioOneIsAlwaysAccepted) {
  // ef-sgd uses the GRAD stream only; the final full average still runs.
  ASSERT_NO_FATAL_FAILURE(Start("name: \"ef-sgd\" ratio: 16", v1::GRAD, 16));
  ExpectRoundCompletes(v1::MODEL, 1);
  ExpectRoundCompletes(v1::GRAD, 16);

  {
    SCOPED_TRACE("GRAD at ratio 1");
    ExpectRefused(Push(v1::GRAD, next_step_, 1, Shard0Floats(v1::GRAD, next_step_, 1)),
                  grpc::StatusCode::FAILED_PRECONDITION, {"ratio 1", "GRAD at ratio 16"});
  }
  {
    SCOPED_TRACE("MODEL at ratio 16");
    ExpectRefused(Push(v1::MODEL, next_step_, 16, Shard0Floats(v1::MODEL, next_step_, 16)),
                  grpc::StatusCode::FAILED_PRECONDITION, {"stream MODEL", "GRAD at ratio 16"});
  }
  ExpectRoundCompletes(v1::MODEL, 1);
}

TEST_F(RefusalTest, CseaAcceptsTheFinalFullAverage) {
  ASSERT_NO_FATAL_FAILURE(Start("name: \"csea\" ratio_c1: 8", v1::MODEL, 8));
  ExpectRoundCompletes(v1::MODEL, 8);
  ExpectRoundCompletes(v1::MODEL, 1);
  EXPECT_EQ(ShardStatus().rounds_failed(), 0u);
}

}  // namespace
}  // namespace cserps
