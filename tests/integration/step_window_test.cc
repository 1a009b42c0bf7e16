// The server's step window counts sync periods for periodic algorithms:
// local SGD with H = 32 pushes only every 32 steps and must not be refused
// as "too far ahead", while a push far beyond max_step_lag periods is.
#include <vector>

#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"

namespace cserps {
namespace {

using testing::InProcessCluster;
using testing::TestConfig;

TEST(StepWindowTest, PeriodicAlgorithmsGetAWindowOfPeriods) {
  const v1::JobConfig config = TestConfig(R"pb(
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 10 max_step_lag: 2 }
    model { kind: SOFTMAX input_dim: 4 num_classes: 2 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "local-sgd" period: 32 block_size: 4 }
    epochs: 1
  )pb");
  constexpr uint64_t kParams = 10;
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(config, kParams);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // The first sync comes after step 31 with no round completed before it,
  // the next one 2 periods (the whole window) later.
  for (uint64_t step : {31, 31 + 2 * 32}) {
    const absl::Status synced = (*cluster)->OnEveryRank([&](int rank) {
      std::vector<float> x(kParams, static_cast<float>(rank));
      return (*cluster)->client(rank).AverageBlocks(v1::MODEL, step, 1, x, 1.0f, 0.0f,
                                                    absl::MakeSpan(x));
    });
    ASSERT_TRUE(synced.ok()) << "step " << step << ": " << synced;
  }
  // One step beyond the window is refused at once, naming the window.
  std::vector<float> x(kParams, 0.0f);
  const absl::Status ahead = (*cluster)->client(0).AverageBlocks(
      v1::MODEL, 95 + 2 * 32 + 1, 1, x, 1.0f, 0.0f, absl::MakeSpan(x));
  EXPECT_EQ(ahead.code(), absl::StatusCode::kOutOfRange) << ahead;
  EXPECT_NE(ahead.message().find("too far ahead: newest completed step is 95, max_step_lag 64"),
            std::string::npos)
      << ahead;
}

}  // namespace
}  // namespace cserps
