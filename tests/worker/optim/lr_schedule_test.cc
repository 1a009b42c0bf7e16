#include "worker/optim/lr_schedule.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using Opt = v1::OptimizerConfig;

constexpr double kPi = 3.14159265358979323846;

TEST(LrScheduleTest, ConstantAndUnspecified) {
  for (Opt::Schedule kind : {Opt::SCHEDULE_UNSPECIFIED, Opt::CONSTANT}) {
    Opt config;
    config.set_schedule(kind);
    config.set_lr(0.1f);
    LrSchedule schedule(config, 10, 3);
    for (uint64_t step : {0u, 9u, 10u, 29u, 1000u}) {
      EXPECT_FLOAT_EQ(schedule.At(step), 0.1f) << step;
    }
  }
}

// lr 0.8, gamma 0.5 every 2 epochs of 10 steps: epochs 0-1 → 0.8,
// 2-3 → 0.4, 4-5 → 0.2, 6 → 0.1.
TEST(LrScheduleTest, StepDecay) {
  Opt config;
  config.set_schedule(Opt::STEP_DECAY);
  config.set_lr(0.8f);
  config.set_gamma(0.5f);
  config.set_step_epochs(2);
  LrSchedule schedule(config, 10, 7);
  EXPECT_FLOAT_EQ(schedule.At(0), 0.8f);
  EXPECT_FLOAT_EQ(schedule.At(19), 0.8f);
  EXPECT_FLOAT_EQ(schedule.At(20), 0.4f);
  EXPECT_FLOAT_EQ(schedule.At(39), 0.4f);
  EXPECT_FLOAT_EQ(schedule.At(40), 0.2f);
  EXPECT_FLOAT_EQ(schedule.At(60), 0.1f);
}

// lr 1, 10 steps per epoch, 3 epochs → T = 30; warm-up 0.6 epochs → W = 6.
// Warm-up: (step + 1) / 6. Cosine over T - W = 24 steps:
// step 6 → 1, step 14 (a third) → 0.5 (1 + cos(pi/3)) = 0.75,
// step 18 (half) → 0.5, step 22 (two thirds) → 0.25, step 30 → 0.
TEST(LrScheduleTest, WarmupCosine) {
  Opt config;
  config.set_schedule(Opt::WARMUP_COSINE);
  config.set_lr(1.0f);
  config.set_warmup_epochs(0.6f);
  LrSchedule schedule(config, 10, 3);
  EXPECT_EQ(schedule.warmup_steps(), 6u);
  EXPECT_EQ(schedule.total_steps(), 30u);
  EXPECT_FLOAT_EQ(schedule.At(0), 1.0f / 6);
  EXPECT_FLOAT_EQ(schedule.At(2), 0.5f);
  EXPECT_FLOAT_EQ(schedule.At(5), 1.0f);
  EXPECT_FLOAT_EQ(schedule.At(6), 1.0f);
  EXPECT_FLOAT_EQ(schedule.At(14), 0.75f);
  EXPECT_FLOAT_EQ(schedule.At(18), 0.5f);
  EXPECT_FLOAT_EQ(schedule.At(22), 0.25f);
  EXPECT_NEAR(schedule.At(29), 0.5 * (1 + std::cos(kPi * 23 / 24)), 1e-7);
  EXPECT_EQ(schedule.At(30), 0.0f);
  EXPECT_EQ(schedule.At(100), 0.0f);
}

// warm-up rounds to the nearest step: 0.25 * 10 = 2.5 → 3 (half away from
// zero), and no warm-up at all starts the cosine at step 0.
TEST(LrScheduleTest, WarmupRoundingAndNoWarmup) {
  Opt config;
  config.set_schedule(Opt::WARMUP_COSINE);
  config.set_lr(2.0f);
  config.set_warmup_epochs(0.25f);
  EXPECT_EQ(LrSchedule(config, 10, 2).warmup_steps(), 3u);
  EXPECT_FLOAT_EQ(LrSchedule(config, 10, 2).At(0), 2.0f / 3);

  config.set_warmup_epochs(0.0f);
  LrSchedule no_warmup(config, 10, 2);
  EXPECT_EQ(no_warmup.warmup_steps(), 0u);
  EXPECT_FLOAT_EQ(no_warmup.At(0), 2.0f);
  EXPECT_FLOAT_EQ(no_warmup.At(10), 1.0f);  // half of T = 20
}

// The test vectors of docs/protocol.md 18, which a client in another
// language checks its schedule against, bit for bit.
TEST(LrScheduleTest, DocumentedVectors) {
  std::ifstream in(std::string(CSERPS_SOURCE_DIR) + "/docs/protocol.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  const std::regex row(
      "\\| `([^`]*schedule: [A-Z_]+[^`]*)` \\| ([0-9]+) \\| ([0-9]+) \\| ([0-9]+) \\| [^|]+ "
      "\\| `0x([0-9a-f]{8})` \\|");
  int rows = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    SCOPED_TRACE(m[0].str());
    ++rows;
    Opt config;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(m[1].str(), &config));
    LrSchedule schedule(config, std::stoull(m[2].str()), std::stoull(m[3].str()));
    const float lr = schedule.At(std::stoull(m[4].str()));
    uint32_t bits = 0;
    std::memcpy(&bits, &lr, sizeof(bits));
    EXPECT_EQ(bits, static_cast<uint32_t>(std::stoul(m[5].str(), nullptr, 16))) << lr;
  }
  EXPECT_GE(rows, 20);
}

}  // namespace
}  // namespace cserps
