// The device optimizer step against ComputeDirection (common/direction.h)
// and the CPU's x -= lr * p: bit for bit, over several steps so that the
// momentum buffer carries state.
#include "worker/cuda/kernels/update_kernels.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "common/direction.h"

namespace cserps {
namespace {

constexpr size_t kN = 10007;  // not a multiple of any block size
constexpr int kSteps = 5;

std::vector<float> RandomVector(uint64_t key, size_t n, float scale) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) x = scale * (2.0f * rng.UniformFloat() - 1.0f);
  return v;
}

v1::OptimizerConfig Config(v1::OptimizerConfig::Momentum kind) {
  v1::OptimizerConfig config;
  config.set_momentum_kind(kind);
  config.set_momentum(0.9f);
  config.set_weight_decay(5e-4f);
  return config;
}

void ExpectSameBits(const std::vector<float>& cpu, const std::vector<float>& gpu,
                    const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &cpu[i], 4);
    std::memcpy(&b, &gpu[i], 4);
    ASSERT_EQ(a, b) << what << " at " << i << ": cpu " << cpu[i] << ", gpu " << gpu[i];
  }
}

const v1::OptimizerConfig::Momentum kKinds[] = {
    v1::OptimizerConfig::MOMENTUM_UNSPECIFIED, v1::OptimizerConfig::NONE,
    v1::OptimizerConfig::HEAVY_BALL, v1::OptimizerConfig::NESTEROV};

TEST(UpdateKernelsTest, UnknownMomentumKindIsRejectedBeforeAnyLaunch) {
  DirectionRule rule;
  rule.kind = static_cast<v1::OptimizerConfig::Momentum>(77);
  const absl::Status status =
      cuda::LaunchDirection(rule, 4, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(cuda::LaunchSgdStep(rule, 4, 0.1f, nullptr, nullptr, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Direction then Descend, and the fused step, against the CPU, step by step.
TEST(UpdateKernelsTest, MatchesCpuDirectionAndDescentBitForBit) {
  CSERPS_SKIP_WITHOUT_GPU();
  const float lr = 0.05f;
  for (const auto kind : kKinds) {
    const std::string name = v1::OptimizerConfig::Momentum_Name(kind);
    const v1::OptimizerConfig config = Config(kind);
    const DirectionRule rule = MakeDirectionRule(config);
    std::vector<float> cpu_m(kN, 0.0f);  // the CPU's momentum
    std::vector<float> x = RandomVector(DeriveKey(1, kind), kN, 1.0f);
    std::vector<float> p(kN);

    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_x, Upload(x));
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_x_fused, Upload(x));
    const std::vector<float> zeros(kN, 0.0f);
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_m, Upload(zeros));
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_m_fused, Upload(zeros));
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_p, DeviceBuffer<float>::Allocate(kN));

    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> g = RandomVector(DeriveKey(2, step), kN, 0.3f);
      CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_g, Upload(g));
      CSERPS_ASSERT_OK(cuda::LaunchDirection(rule, kN, d_g.data(), d_x.data(),
                                             d_m.data(), d_p.data(), nullptr));
      CSERPS_ASSERT_OK(cuda::LaunchDescend(kN, lr, d_p.data(), d_x.data(), nullptr));
      CSERPS_ASSERT_OK(cuda::LaunchSgdStep(rule, kN, lr, d_g.data(), d_m_fused.data(),
                                           d_x_fused.data(), nullptr));

      ComputeDirection(rule, kN, g.data(), x.data(), cpu_m.data(), p.data());
      for (size_t j = 0; j < kN; ++j) x[j] -= lr * p[j];

      const std::string what = name + " step " + std::to_string(step);
      CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> gpu_p, Download(d_p.data(), kN));
      ExpectSameBits(p, gpu_p, what + ": direction");
      CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> gpu_x, Download(d_x.data(), kN));
      ExpectSameBits(x, gpu_x, what + ": params");
      CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> fused_x,
                                  Download(d_x_fused.data(), kN));
      ExpectSameBits(x, fused_x, what + ": params (fused)");
      if (rule.kind != v1::OptimizerConfig::NONE) {
        const std::vector<float>& m = cpu_m;
        CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> gpu_m, Download(d_m.data(), kN));
        ExpectSameBits(m, gpu_m, what + ": momentum");
        CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> fused_m,
                                    Download(d_m_fused.data(), kN));
        ExpectSameBits(m, fused_m, what + ": momentum (fused)");
      }
    }
  }
}

// direction may alias grad, as ComputeDirection allows.
TEST(UpdateKernelsTest, DirectionInPlaceOverGradient) {
  CSERPS_SKIP_WITHOUT_GPU();
  const v1::OptimizerConfig config = Config(v1::OptimizerConfig::NESTEROV);
  std::vector<float> cpu_m(kN, 0.0f);
  const std::vector<float> x = RandomVector(3, kN, 1.0f);
  std::vector<float> g = RandomVector(4, kN, 0.3f);
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_x, Upload(x));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_g, Upload(g));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> d_m, Upload(std::vector<float>(kN, 0.0f)));
  CSERPS_ASSERT_OK(cuda::LaunchDirection(MakeDirectionRule(config), kN, d_g.data(),
                                         d_x.data(), d_m.data(), d_g.data(), nullptr));
  ComputeDirection(MakeDirectionRule(config), kN, g.data(), x.data(), cpu_m.data(), g.data());
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> gpu_p, Download(d_g.data(), kN));
  ExpectSameBits(g, gpu_p, "in-place direction");
}

}  // namespace
}  // namespace cserps
