// The device algorithms (worker/device/device_algorithms.h) on HostDeviceOps
// against the host algorithms (worker/algorithms/), each run on its own
// in-process cluster with the same job, gradients and start: every rank's
// model after every step, after Finish, and the servers' model must agree
// bit for bit. The host device uses the host loops' float expressions, so
// any difference is in the device algorithm's logic: a wrong buffer, block
// set, stream, scatter kind, reset or order. The GPU tests hold the CUDA
// device to the host device, op by op.
//
// Three workers of unequal weights (3, 5, 8), 2 shards, 12 steps (three
// periods of 4), as the reference tests; async SGD runs one worker, since
// with several its result depends on the arrival order.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/device/device_algorithms.h"
#include "worker/device/host_device_ops.h"

namespace cserps {
namespace {

using testing::AlgorithmMaker;
using testing::BitEqual;
using testing::ClusterRun;
using testing::InitialModel;
using testing::MakeJobConfig;
using testing::NumParams;
using testing::RunOnCluster;
using testing::SyntheticGradients;

constexpr int kSteps = 12;
constexpr uint64_t kSeed = 77;

// A device algorithm on host memory, seen as an Algorithm: its buffers are
// host pointers, so the harness's spans are the device buffers.
class OnHostDevice final : public Algorithm {
 public:
  OnHostDevice(const AlgorithmContext& context, std::unique_ptr<HostDeviceOps> ops,
               std::unique_ptr<DeviceAlgorithm> device)
      : Algorithm(context), ops_(std::move(ops)), device_(std::move(device)) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    return device_->Step(t, lr, g.data(), x.data());
  }
  absl::Status Finish(uint64_t step, absl::Span<float> x) override {
    return device_->Finish(step, x.data());
  }

 private:
  std::unique_ptr<HostDeviceOps> ops_;  // before device_, which uses it
  std::unique_ptr<DeviceAlgorithm> device_;
};

absl::StatusOr<std::unique_ptr<Algorithm>> MakeOnHostDevice(const AlgorithmContext& context,
                                                            PsClient& client) {
  auto ops = std::make_unique<HostDeviceOps>(context.num_params(),
                                             context.algorithm().block_size());
  DeviceAlgorithmContext device_context;
  device_context.config = context.config;
  device_context.client = &client;
  device_context.ops = ops.get();
  device_context.weight = context.weight;
  absl::StatusOr<std::unique_ptr<DeviceAlgorithm>> device =
      MakeDeviceAlgorithm(device_context);
  if (!device.ok()) return device.status();
  return std::make_unique<OnHostDevice>(context, std::move(ops), *std::move(device));
}

struct Case {
  std::string label;
  std::string algorithm;
  std::string optimizer;
  std::vector<uint32_t> weights = {3, 5, 8};
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.label; }

class DeviceAlgorithmsTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceAlgorithmsTest, EqualsTheHostAlgorithmBitForBit) {
  const Case& c = GetParam();
  const v1::JobConfig config = MakeJobConfig(c.algorithm, c.optimizer, c.weights);
  ASSERT_TRUE(HasDeviceAlgorithm(config.algorithm()));
  const size_t d = NumParams(config);
  const SyntheticGradients gradients(kSeed, static_cast<int>(c.weights.size()), d);
  const std::vector<float> x0 = InitialModel(kSeed, d);

  absl::StatusOr<ClusterRun> host = RunOnCluster(config, gradients, x0, kSteps, true);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<ClusterRun> device =
      RunOnCluster(config, gradients, x0, kSteps, true, MakeOnHostDevice);
  ASSERT_TRUE(device.ok()) << device.status();

  for (int t = 0; t < kSteps; ++t) {
    for (size_t r = 0; r < c.weights.size(); ++r) {
      ASSERT_TRUE(BitEqual(device->models[t][r], host->models[t][r]))
          << "rank " << r << " after step " << t;
    }
  }
  for (size_t r = 0; r < c.weights.size(); ++r) {
    EXPECT_TRUE(BitEqual(device->finished[r], host->finished[r])) << "rank " << r;
  }
  EXPECT_TRUE(BitEqual(device->server_model, host->server_model));
  // Not a run that stood still: the models moved from x0.
  EXPECT_FALSE(BitEqual(host->finished[0], x0));
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, DeviceAlgorithmsTest,
    ::testing::Values(
        Case{"ssgd_nesterov", R"(name: "ssgd")",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"ssgd_plain", R"(name: "ssgd")", "lr: 0.05 momentum_kind: NONE"},
        Case{"cser_model_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: MODEL_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_gradient_blocks_heavy_ball",
             R"(name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"m_cser", R"(name: "m-cser" period: 4 ratio_c1: 4 ratio_c2: 8)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"cser_pl", R"(name: "cser-pl" period: 4 ratio_c1: 4)",
             "lr: 0.05 momentum_kind: NONE"},
        Case{"csea_heavy_ball", R"(name: "csea" ratio_c1: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"local_sgd_nesterov", R"(name: "local-sgd" period: 4)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"ef_sgd_nesterov", R"(name: "ef-sgd" ratio: 4)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9"},
        Case{"qsparse_local_sgd", R"(name: "qsparse-local-sgd" period: 4 ratio: 4)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 weight_decay: 0.001"},
        Case{"topk_ssgd", R"(name: "topk-ssgd" density: 0.05)",
             "lr: 0.05 momentum_kind: NONE weight_decay: 0.001"},
        Case{"gtopk_ssgd_nesterov", R"(name: "gtopk-ssgd" density: 0.05)",
             "lr: 0.05 momentum_kind: NESTEROV momentum: 0.9 weight_decay: 0.001"},
        Case{"gtopk_ssgd_heavy_ball", R"(name: "gtopk-ssgd" density: 0.02)",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9"},
        Case{"async_sgd_one_worker", R"(name: "async-sgd")",
             "lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9", {8}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.label; });

TEST(DeviceAlgorithmsRefusalTest, NamesTheAlgorithmsWithoutADeviceTwin) {
  for (const auto& [name, rest] : {std::pair<std::string, std::string>{"cocod-sgd", "period: 4"},
                                   {"pipe-sgd", ""}}) {
    const v1::JobConfig config =
        MakeJobConfig(absl::StrCat("name: \"", name, "\" ", rest), "lr: 0.05", {4, 4});
    EXPECT_FALSE(HasDeviceAlgorithm(config.algorithm())) << name;
    absl::StatusOr<ClusterRun> run = RunOnCluster(
        config, SyntheticGradients(kSeed, 2, NumParams(config)),
        InitialModel(kSeed, NumParams(config)), 1, false, MakeOnHostDevice);
    ASSERT_FALSE(run.ok()) << name;
    EXPECT_EQ(run.status().code(), absl::StatusCode::kUnimplemented) << run.status();
    EXPECT_NE(run.status().message().find(name), std::string::npos) << run.status();
  }
}

}  // namespace
}  // namespace cserps
