// ExternalTrainer (the PyTorch front's trainer) on the CUDA device ops
// against ExternalTrainer on the host ops, each on its own in-process
// cluster with the same FLAT job: the caller's buffers are device memory on
// one and host memory on the other, every step gets the same gradient (a
// function of the parameters, computed on the host), and the parameters
// after every step, the checkpoint's state buffers and the model after the
// final average are the same bits (the device ops compute what the host
// ops do, operation by operation); so are the files of a job's own
// checkpoints. This is the C++ half of CUDA tensors in cserps.torch,
// checked without a CUDA build of torch.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/cuda/cuda_device_ops.h"
#include "worker/trainer/external_trainer.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;

constexpr uint64_t kD = 1003;  // a tail block of 3
constexpr int kWorkers = 2;
constexpr int kSteps = 8;
constexpr int kSaveAfter = 3;

v1::JobConfig MakeConfig(const std::string& algorithm, const std::string& momentum) {
  return TestConfig(absl::StrCat(R"pb(
    name: "gpu-external-trainer-test"
    seed: 5
    cluster { servers: "127.0.0.1:0" servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 20 }
    model { kind: FLAT num_params: )pb", kD, R"pb( }
    data { batch_size: 16 }
    optimizer { lr: 0.05 momentum: 0.9 weight_decay: 0.0001 momentum_kind: )pb", momentum,
                                 R"pb( }
    algorithm { )pb", algorithm, R"pb( block_size: 8 }
    epochs: 1
  )pb"));
}

// The gradient of rank r's step t at parameters x.
std::vector<float> Gradient(const std::vector<float>& x, int r, int t) {
  std::vector<float> g(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    g[j] = 0.1f * x[j] + std::sin(static_cast<float>(j + 7 * t + 13 * r));
  }
  return g;
}

// What one rank's trainer went through: its parameters after every step,
// its checkpoint after kSaveAfter steps, its model after Finish.
struct Record {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> state;
  std::vector<float> final;
};

// The caller's buffers in host memory, or in device memory when `device`.
class Buffers {
 public:
  explicit Buffers(bool device) : device_(device), host_params_(kD), host_grad_(kD) {}
  ~Buffers() {
    if (params_ != nullptr) cudaFree(params_);
    if (grad_ != nullptr) cudaFree(grad_);
  }

  absl::Status Allocate() {
    if (!device_) return absl::OkStatus();
    constexpr size_t kBytes = kD * sizeof(float);
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&params_), kBytes));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&grad_), kBytes));
    return absl::OkStatus();
  }
  float* params() { return device_ ? params_ : host_params_.data(); }
  float* grad() { return device_ ? grad_ : host_grad_.data(); }

  absl::StatusOr<std::vector<float>> ReadParams() {
    if (!device_) return host_params_;
    std::vector<float> out(kD);
    CSERPS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out.data(), params_, kD * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
  absl::Status Write(float* to, const std::vector<float>& from) {
    if (!device_) {
      std::memcpy(to, from.data(), kD * sizeof(float));
      return absl::OkStatus();
    }
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(to, from.data(), kD * sizeof(float), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

 private:
  const bool device_;
  float* params_ = nullptr;  // device memory
  float* grad_ = nullptr;
  std::vector<float> host_params_;
  std::vector<float> host_grad_;
};

absl::Status Train(InProcessCluster& cluster, int r, bool device, Record* record) {
  std::unique_ptr<DeviceOps> ops;
  TestStream stream;
  if (device) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
    if (stream.get() == nullptr) return absl::InternalError("no CUDA stream");
    ASSIGN_OR_RETURN(ops, CudaDeviceOps::Create(kD, cluster.config().algorithm().block_size(),
                                                stream.get()));
  }
  Buffers buffers(device);  // outlives the trainer, which works on it
  RETURN_IF_ERROR(buffers.Allocate());
  ExternalTrainerOptions options;
  options.requested_rank = r;
  options.worker_id = absl::StrCat("test-worker-", r);  // the cluster's, reclaimed
  options.steps_per_epoch = kSteps;  // the job's one epoch
  ASSIGN_OR_RETURN(std::unique_ptr<ExternalTrainer> trainer,
                   ExternalTrainer::Create(cluster.config(), options, std::move(ops)));
  std::vector<float> initial(kD);
  for (uint64_t j = 0; j < kD; ++j) initial[j] = std::cos(static_cast<float>(j + 31 * r));
  RETURN_IF_ERROR(buffers.Write(buffers.params(), initial));
  RETURN_IF_ERROR(trainer->InitializeModel(absl::MakeSpan(buffers.params(), kD)));
  for (int t = 0; t < kSteps; ++t) {
    ASSIGN_OR_RETURN(const std::vector<float> x, buffers.ReadParams());
    RETURN_IF_ERROR(buffers.Write(buffers.grad(), Gradient(x, r, t)));
    RETURN_IF_ERROR(trainer->Step(0.05f, absl::MakeConstSpan(buffers.grad(), kD),
                                  absl::MakeSpan(buffers.params(), kD)));
    ASSIGN_OR_RETURN(std::vector<float> after, buffers.ReadParams());
    record->params.push_back(std::move(after));
    if (t + 1 == kSaveAfter) {
      record->state.assign(trainer->StateSize(), std::vector<float>(kD));
      std::vector<absl::Span<float>> out;
      for (std::vector<float>& buffer : record->state) out.push_back(absl::MakeSpan(buffer));
      RETURN_IF_ERROR(trainer->SaveState(absl::MakeConstSpan(buffers.params(), kD), out));
    }
  }
  RETURN_IF_ERROR(trainer->Finish(absl::MakeSpan(buffers.params(), kD)));
  ASSIGN_OR_RETURN(record->final, buffers.ReadParams());
  return absl::OkStatus();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GpuExternalTrainerTest
    : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(GpuExternalTrainerTest, DeviceBuffersTakeTheHostsStepsBitForBit) {
  CSERPS_SKIP_WITHOUT_GPU();
  const v1::JobConfig config = MakeConfig(GetParam().first, GetParam().second);
  std::vector<Record> host(kWorkers), device(kWorkers);
  {
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> cluster,
                                InProcessCluster::Start(config, kD));
    CSERPS_ASSERT_OK(cluster->OnEveryRank(
        [&](int r) { return Train(*cluster, r, /*device=*/false, &host[r]); }));
  }
  {
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> cluster,
                                InProcessCluster::Start(config, kD));
    CSERPS_ASSERT_OK(cluster->OnEveryRank(
        [&](int r) { return Train(*cluster, r, /*device=*/true, &device[r]); }));
  }
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(device[r].params.size(), host[r].params.size());
    for (size_t t = 0; t < host[r].params.size(); ++t) {
      EXPECT_TRUE(SameBits(device[r].params[t], host[r].params[t]))
          << "rank " << r << " step " << t;
    }
    ASSERT_EQ(device[r].state.size(), host[r].state.size()) << "rank " << r;
    for (size_t i = 0; i < host[r].state.size(); ++i) {
      EXPECT_TRUE(SameBits(device[r].state[i], host[r].state[i]))
          << "rank " << r << " state buffer " << i;
    }
    EXPECT_TRUE(SameBits(device[r].final, host[r].final)) << "rank " << r;
  }
  // The workers trained: the model moved, and every worker ends with one.
  EXPECT_FALSE(SameBits(host[0].params.front(), host[0].final));
  EXPECT_TRUE(SameBits(host[0].final, host[1].final));
}

// A job with checkpoints of its own (checkpoint.every_steps): the device
// buffers take the host's steps through the checkpoints' averages, and the
// rank files (their state read back from the device) are the host's, byte
// for byte.
TEST(GpuExternalTrainerCheckpointTest, DeviceBuffersWriteTheHostsCheckpointFiles) {
  CSERPS_SKIP_WITHOUT_GPU();
  constexpr uint32_t kEvery = 3;
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / "gpu_external_trainer_checkpoints";
  std::filesystem::remove_all(root);
  std::vector<Record> records[2];  // host, device
  for (bool device : {false, true}) {
    v1::JobConfig config =
        MakeConfig(R"pb(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)pb", "HEAVY_BALL");
    config.mutable_checkpoint()->set_dir((root / (device ? "device" : "host")).string());
    config.mutable_checkpoint()->set_every_steps(kEvery);
    std::vector<Record>& record = records[device ? 1 : 0];
    record.resize(kWorkers);
    CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<InProcessCluster> cluster,
                                InProcessCluster::Start(config, kD));
    CSERPS_ASSERT_OK(cluster->OnEveryRank(
        [&](int r) { return Train(*cluster, r, device, &record[r]); }));
  }
  for (int r = 0; r < kWorkers; ++r) {
    for (size_t t = 0; t < records[0][r].params.size(); ++t) {
      EXPECT_TRUE(SameBits(records[1][r].params[t], records[0][r].params[t]))
          << "rank " << r << " step " << t;
    }
    for (uint64_t step = kEvery; step < kSteps; step += kEvery) {
      const std::string name = CheckpointFileName(CheckpointRole::kRank, r);
      std::string bytes[2];
      for (int i = 0; i < 2; ++i) {
        std::ifstream in(CheckpointStepDir((root / (i == 1 ? "device" : "host")).string(), step) +
                             "/" + name,
                         std::ios::binary);
        ASSERT_TRUE(in) << name << " of step " << step;
        bytes[i].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      }
      EXPECT_FALSE(bytes[0].empty());
      EXPECT_EQ(bytes[1], bytes[0]) << name << " of step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, GpuExternalTrainerTest,
    ::testing::Values(std::make_pair(R"pb(name: "ssgd")pb", "NESTEROV"),
                      std::make_pair(R"pb(name: "cser" period: 2 ratio_c1: 2 ratio_c2: 4)pb",
                                     "HEAVY_BALL"),
                      std::make_pair(R"pb(name: "ef-sgd" ratio: 4)pb", "NESTEROV"),
                      // Checkpoints that land an average in flight.
                      std::make_pair(R"pb(name: "cocod-sgd" period: 2)pb", "HEAVY_BALL"),
                      std::make_pair(R"pb(name: "pipe-sgd")pb", "NESTEROV")));

}  // namespace
}  // namespace cserps
