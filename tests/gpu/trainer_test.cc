// The Trainer (worker/trainer/trainer.h) on the GPU (CudaBackend) against
// the Trainer on its default HostBackend with the CPU model, each on its own
// in-process cluster with the same job and data: their loss curves (every
// step's loss, relative 1e-4) and their models after the final average
// agree to float rounding (the CUDA model sums in another order), for S-SGD
// with Nesterov momentum, CSER (MODEL_BLOCKS) with heavy ball, EF-SGD and
// QSparse-local-SGD (error buffers on the device), each with two workers so
// that the averages mix real differences. (The top-k methods are not here:
// a rounding difference in the gradients may flip a near tie in the
// selection; tests/gpu/device_ops_test.cc holds their top-k to the CPU's.)
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"
#include "common/prng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/kernels/cuda_model.h"
#include "worker/trainer/trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;

constexpr uint64_t kDim = 24;
constexpr uint64_t kClasses = 10;
constexpr int kWorkers = 2;
constexpr int kSteps = 6;

// Labels from a fixed random linear map of the features, so the loss falls.
Dataset MakeData(size_t size, uint64_t seed) {
  Dataset data;
  data.size = size;
  data.dim = kDim;
  data.num_classes = kClasses;
  CounterRng rng(seed);
  for (size_t i = 0; i < size; ++i) {
    float best = -1e30f;
    uint8_t label = 0;
    std::vector<float> x(kDim);
    for (float& v : x) v = rng.UniformFloat() * 2 - 1;
    for (uint64_t c = 0; c < kClasses; ++c) {
      float score = 0;
      for (uint64_t j = 0; j < kDim; ++j) score += x[j] * std::sin(1.0f + c * kDim + j);
      if (score > best) {
        best = score;
        label = static_cast<uint8_t>(c);
      }
    }
    data.features.insert(data.features.end(), x.begin(), x.end());
    data.labels.push_back(label);
  }
  return data;
}

v1::JobConfig MakeConfig(const std::string& algorithm, const std::string& momentum,
                         const std::string& output_dir) {
  return TestConfig(absl::StrCat(R"pb(
    name: "gpu-trainer-test"
    seed: 5
    output_dir: ")pb", output_dir, R"pb("
    cluster { servers: "127.0.0.1:0" servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 20 }
    model { kind: MLP input_dim: )pb", kDim, R"pb( hidden: 16 num_classes: 10 }
    data { batch_size: 16 }
    optimizer { lr: 0.05 momentum_kind: )pb", momentum,
      momentum == "NONE" ? "" : " momentum: 0.9", R"pb( }
    algorithm { )pb", algorithm, R"pb( block_size: 8 }
    epochs: 1
  )pb"));
}

void ExpectClose(const std::vector<float>& got, absl::Span<const float> want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    diff += (double{got[j]} - want[j]) * (double{got[j]} - want[j]);
    norm += double{want[j]} * want[j];
  }
  EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << what;
}

// kSteps steps of `trainer` from its initial model, their losses appended
// to `losses`, then the final average; the model it ends with in `model`.
absl::Status TrainSteps(Trainer& trainer, std::vector<float>* losses,
                        std::vector<float>* model) {
  RETURN_IF_ERROR(trainer.InitializeModel());
  for (int t = 0; t < kSteps; ++t) {
    ASSIGN_OR_RETURN(const float loss, trainer.Step());
    losses->push_back(loss);
  }
  RETURN_IF_ERROR(trainer.FinishTraining());
  ASSIGN_OR_RETURN(*model, trainer.Params());
  return absl::OkStatus();
}

class GpuTrainerTest : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(GpuTrainerTest, CudaBackendMatchesHostBackend) {
  CSERPS_SKIP_WITHOUT_GPU();
  const std::string dir = ::testing::TempDir() + "/gpu_trainer_test";
  const v1::JobConfig config = MakeConfig(GetParam().first, GetParam().second, dir);
  const Dataset train = MakeData(512, 1);
  const Dataset test = MakeData(200, 2);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> probe,
                              CudaModel::Create(config.model()));
  const uint64_t d = probe->spec().num_params;

  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> host_cluster,
                              InProcessCluster::Start(config, d));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> device_cluster,
                              InProcessCluster::Start(config, d));
  std::vector<std::vector<float>> host_models(kWorkers), device_models(kWorkers);
  // The loss curves: every rank's training loss at every step.
  std::vector<std::vector<float>> host_losses(kWorkers), device_losses(kWorkers);
  CSERPS_ASSERT_OK(host_cluster->OnEveryRank([&](int r) -> absl::Status {
    // No backend: HostBackend with the CPU model.
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(host_cluster->config(), &host_cluster->client(r),
                                     &train, &test));
    return TrainSteps(*trainer, &host_losses[r], &host_models[r]);
  }));
  CSERPS_ASSERT_OK(device_cluster->OnEveryRank([&](int r) -> absl::Status {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                     CudaBackend::ForJob(device_cluster->config()));
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(device_cluster->config(),
                                     {&device_cluster->client(r), nullptr}, &train, &test,
                                     /*metrics=*/nullptr, std::move(backend)));
    return TrainSteps(*trainer, &device_losses[r], &device_models[r]);
  }));
  for (int r = 0; r < kWorkers; ++r) {
    ExpectClose(device_models[r], host_models[r], absl::StrCat("rank ", r));
    ASSERT_EQ(device_losses[r].size(), host_losses[r].size());
    for (size_t t = 0; t < host_losses[r].size(); ++t) {
      EXPECT_NEAR(device_losses[r][t], host_losses[r][t], 1e-4 * std::abs(host_losses[r][t]))
          << "rank " << r << " step " << t;
    }
  }
  // After the final average both workers hold the servers' model; the
  // models moved away from the initial one.
  ExpectClose(device_models[1], device_models[0], "device ranks");
  std::vector<float> initial(d);
  probe->Initialize(config.seed(), absl::MakeSpan(initial));
  double moved = 0;
  for (uint64_t j = 0; j < d; ++j) moved += std::abs(device_models[0][j] - initial[j]);
  EXPECT_GT(moved, 1e-3);
}

// Run() on CudaBackend writes the summary files and records the worker
// metrics.
TEST(GpuTrainerRunTest, WritesTheSummaryAndMetrics) {
  CSERPS_SKIP_WITHOUT_GPU();
  const std::string dir = ::testing::TempDir() + "/gpu_trainer_run";
  std::filesystem::remove_all(dir);
  const v1::JobConfig config = MakeConfig(R"pb(name: "ssgd")pb", "NESTEROV", dir);
  const Dataset train = MakeData(512, 1);
  const Dataset test = MakeData(200, 2);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> probe,
                              CudaModel::Create(config.model()));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> cluster,
                              InProcessCluster::Start(config, probe->spec().num_params));
  std::vector<std::unique_ptr<MetricsRegistry>> registries;
  std::vector<std::unique_ptr<WorkerMetrics>> metrics;
  for (int r = 0; r < kWorkers; ++r) {
    registries.push_back(MetricsRegistry::WithoutEndpoint());
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WorkerMetrics> m,
                                WorkerMetrics::Create(registries.back().get(), r, "ssgd"));
    metrics.push_back(std::move(m));
  }
  std::vector<uint64_t> steps(kWorkers);
  CSERPS_ASSERT_OK(cluster->OnEveryRank([&](int r) -> absl::Status {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                     CudaBackend::ForJob(cluster->config()));
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(cluster->config(), {&cluster->client(r), nullptr}, &train,
                                     &test, metrics[r].get(), std::move(backend)));
    RETURN_IF_ERROR(trainer->Run());
    steps[r] = trainer->step();
    return absl::OkStatus();
  }));
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir + absl::StrCat("/worker_", r, ".json")));
    EXPECT_TRUE(std::filesystem::exists(dir + absl::StrCat("/worker_", r, ".csv")));
    ASSERT_GT(steps[r], 0u);
    const std::string text = registries[r]->Collect();
    double scraped = -1;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, "cserps_worker_steps_total{")) {
        EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &scraped)) << line;
      }
    }
    EXPECT_EQ(scraped, static_cast<double>(steps[r])) << text;
    EXPECT_THAT(text, ::testing::HasSubstr("cserps_worker_test_accuracy{"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, GpuTrainerTest,
    ::testing::Values(std::make_pair(R"pb(name: "ssgd")pb", "NESTEROV"),
                      std::make_pair(R"pb(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)pb",
                                     "HEAVY_BALL"),
                      std::make_pair(R"pb(name: "ef-sgd" ratio: 4)pb", "NESTEROV"),
                      std::make_pair(R"pb(name: "qsparse-local-sgd" period: 2 ratio: 2)pb",
                                     "NONE"),
                      // Averages left in flight: one, and two at once.
                      std::make_pair(R"pb(name: "cocod-sgd" period: 2)pb", "HEAVY_BALL"),
                      std::make_pair(R"pb(name: "pipe-sgd")pb", "NESTEROV")));

}  // namespace
}  // namespace cserps
