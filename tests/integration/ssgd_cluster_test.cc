// S-SGD on a real cluster in one process: 2 server shards on 127.0.0.1 and
// 3 workers (threads, each with its own gRPC client and trainer) with
// unequal batch sizes and a model large enough that every shard's payload is
// cut into several chunks. After every step all workers and the servers hold
// bit-identical parameters, and the trajectory matches single-process
// large-batch SGD.
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/config.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"
#include "tests/testing/test_support.h"
#include "worker/data/batcher.h"
#include "worker/data/partition.h"
#include "worker/model/model.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps/ps_client.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::RelativeL2;

constexpr size_t kDim = 20;
constexpr size_t kClasses = 4;
constexpr size_t kExamples = 180;
constexpr int kSteps = 13;

constexpr char kConfig[] = R"pb(
  name: "ssgd-cluster-test"
  seed: 7
  cluster {
    servers: "127.0.0.1:0"
    servers: "127.0.0.1:0"
    num_workers: 3
    max_message_bytes: 65536
    round_timeout_s: 60
  }
  model { kind: MLP hidden: 2048 input_dim: 20 num_classes: 4 }
  data { rank_batch_sizes: 4 rank_batch_sizes: 6 rank_batch_sizes: 8 }
  optimizer {
    lr: 0.05
    momentum_kind: NESTEROV
    momentum: 0.9
    weight_decay: 0.001
    schedule: STEP_DECAY
    step_epochs: 1
    gamma: 0.5
  }
  algorithm { name: "ssgd" block_size: 1000 }
  epochs: 2
)pb";

// Random features and labels, made here so the test needs no data files.
Dataset MakeDataset() {
  return testing::RandomDataset(kExamples, kDim, kClasses, 12345);
}


// Runs fn(rank) on one thread per rank and joins them.
template <typename Fn>
void OnEveryRank(int ranks, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

TEST(SsgdClusterTest, WorkersStayIdenticalAndMatchLargeBatchSgd) {
  absl::StatusOr<v1::JobConfig> parsed = ParseJobConfig(kConfig, "test config");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  v1::JobConfig config = *parsed;
  ApplyDefaults(&config);
  ASSERT_TRUE(ValidateJobConfig(config, {.allow_port_zero = true}).ok());

  std::vector<std::unique_ptr<PsServer>> servers;
  for (uint32_t s = 0; s < 2; ++s) {
    absl::StatusOr<std::unique_ptr<PsServer>> server =
        PsServer::Start(config, s, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    config.mutable_cluster()->set_servers(s, (*server)->address());
    servers.push_back(std::move(*server));
  }

  const Dataset data = MakeDataset();
  absl::StatusOr<std::unique_ptr<Model>> reference_model = MakeCpuModel(config.model());
  ASSERT_TRUE(reference_model.ok());
  const size_t d = (*reference_model)->spec().num_params;

  // Every shard's payload must span several chunks for this test to cover
  // chunking.
  const BlockLayout layout(d, config.algorithm().block_size(), 2);
  for (uint32_t s = 0; s < 2; ++s) {
    ASSERT_GT(NumChunks(layout.ShardSize(s), ChunkFloats(config.cluster().max_message_bytes())), 1u);
  }

  const int n = config.cluster().num_workers();
  std::vector<std::unique_ptr<PsClient>> clients(n);
  std::vector<std::unique_ptr<Trainer>> trainers(n);
  for (int r = 0; r < n; ++r) {
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(config, d);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<uint32_t> rank = (*client)->Register(r, absl::StrCat("worker-", r));
    ASSERT_TRUE(rank.ok()) << rank.status();
    ASSERT_EQ(*rank, static_cast<uint32_t>(r));
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(config, client->get(), &data, &data);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    clients[r] = std::move(*client);
    trainers[r] = std::move(*trainer);
  }
  std::vector<absl::Status> status(n);
  OnEveryRank(n, [&](int r) { status[r] = trainers[r]->InitializeModel(); });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];

  // The reference: one process, one model, the union of the ranks' batches
  // as one large batch, one momentum buffer.
  std::vector<float> x(d);
  (*reference_model)->Initialize(config.seed(), absl::MakeSpan(x));
  const std::vector<float> x0 = x;
  const std::vector<uint32_t> sizes = RankBatchSizes(config);
  const size_t steps_per_epoch = StepsPerEpoch(kExamples, sizes);
  ASSERT_LT(steps_per_epoch, static_cast<size_t>(kSteps));  // crosses an epoch
  std::vector<std::unique_ptr<EpochBatcher>> batchers;
  for (int r = 0; r < n; ++r) {
    batchers.push_back(std::make_unique<EpochBatcher>(
        data, RankRange(kExamples, sizes, r), sizes[r], config.seed(), r));
  }
  testing::ReferenceDirection direction(config.optimizer(), d);
  const LrSchedule schedule(config.optimizer(), steps_per_epoch, config.epochs());
  std::vector<float> grad(d), p(d), pulled(d);

  for (int t = 0; t < kSteps; ++t) {
    OnEveryRank(n, [&](int r) { status[r] = trainers[r]->Step().status(); });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];

    // Bit-identical on every worker and on the servers.
    std::vector<std::vector<float>> params(n);
    for (int r = 0; r < n; ++r) {
      absl::StatusOr<std::vector<float>> p = trainers[r]->Params();
      ASSERT_TRUE(p.ok()) << p.status();
      params[r] = *std::move(p);
    }
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(0, std::memcmp(params[r].data(), params[0].data(), d * sizeof(float)))
          << "rank " << r << " differs from rank 0 after step " << t;
    }
    ASSERT_TRUE(clients[0]->PullModel(absl::MakeSpan(pulled), false).ok());
    ASSERT_EQ(0, std::memcmp(pulled.data(), params[0].data(), d * sizeof(float)))
        << "the servers' model differs from the workers' after step " << t;

    // Reference step on the concatenated batch.
    std::vector<float> features;
    std::vector<uint8_t> labels;
    for (int r = 0; r < n; ++r) {
      if (t % steps_per_epoch == 0) batchers[r]->StartEpoch(t / steps_per_epoch);
      const Batch b = batchers[r]->Get(t % steps_per_epoch);
      features.insert(features.end(), b.features.begin(), b.features.end());
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
    }
    const Batch large{features, labels, labels.size(), kDim};
    (*reference_model)->LossAndGradient(x, large, absl::MakeSpan(grad)).value();
    p = direction.Compute(grad, x);
    const float lr = schedule.At(t);
    for (size_t j = 0; j < d; ++j) x[j] -= lr * p[j];

    EXPECT_LT(RelativeL2(params[0], x), 1e-5) << "after step " << t;
  }
  // The comparison means something only if training moved the model far
  // more than the tolerance.
  EXPECT_GT(RelativeL2(x0, x), 1e-3);

  for (auto& server : servers) {
    absl::StatusOr<v1::GetStatusResponse> st = clients[0]->GetStatus(&server - &servers[0]);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->rounds_failed(), 0u);
    EXPECT_EQ(st->registered(), 3u);
    server->Shutdown();
  }
}

}  // namespace
}  // namespace cserps
