// The job-config rules of nodes (cluster.local_size > 1): the per-rank data
// lists read per process, and the algorithms without an intra-node form are
// refused. (Config rules live in common/config_validate.cc; these are the
// ones node groups brought.)
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

v1::JobConfig Config(uint32_t num_workers, uint32_t local_size, const std::string& more) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfig(
      absl::StrCat("name: \"node-config\" epochs: 1 ",
                   "cluster { servers: \"10.0.0.1:7000\" num_workers: ", num_workers,
                   " local_size: ", local_size, " }\n",
                   "model { kind: SOFTMAX }\noptimizer { lr: 0.1 }\n", more),
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  return *config;
}

TEST(NodeConfigTest, LocalSizeDefaultsToOne) {
  const v1::JobConfig config = Config(3, 0, "data { batch_size: 8 }");
  EXPECT_EQ(config.cluster().local_size(), 1u);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  EXPECT_EQ(RankBatchSizes(config), std::vector<uint32_t>(3, 8));
}

TEST(NodeConfigTest, EveryProcessOfEveryNodeHasABatchSize) {
  const v1::JobConfig config = Config(3, 2, "data { batch_size: 8 }");
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  EXPECT_EQ(RankBatchSizes(config), std::vector<uint32_t>(6, 8));
}

TEST(NodeConfigTest, RankBatchSizesHasOneEntryPerProcess) {
  const v1::JobConfig good = Config(2, 3, "data { rank_batch_sizes: [1, 2, 3, 4, 5, 6] }");
  EXPECT_TRUE(ValidateJobConfig(good).ok());
  EXPECT_EQ(RankBatchSizes(good), (std::vector<uint32_t>{1, 2, 3, 4, 5, 6}));

  // One per node is not enough.
  const absl::Status per_node =
      ValidateJobConfig(Config(2, 3, "data { rank_batch_sizes: [4, 4] }"));
  EXPECT_EQ(per_node.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(per_node.message(),
              HasSubstr("data.rank_batch_sizes: must have one entry per worker: has 2, "
                        "cluster.num_workers x cluster.local_size is 2 x 3 = 6"));
}

TEST(NodeConfigTest, SlowdownsAndSpeedsHaveOneEntryPerProcess) {
  EXPECT_TRUE(ValidateJobConfig(Config(2, 2, "data { batch_size: 4 rank_slowdown: [1, 1, 2, 2] }"))
                  .ok());
  EXPECT_THAT(
      ValidateJobConfig(Config(2, 2, "data { batch_size: 4 rank_slowdown: [1, 2] }")).message(),
      HasSubstr("data.rank_slowdown: must have one entry per worker: has 2"));

  // Proportional sampling over the 4 processes: a total of 4 * 4 = 16
  // examples per step, split 1:1:1:5.
  const v1::JobConfig speeds =
      Config(2, 2, "data { batch_size: 4 rank_speeds: [1, 1, 1, 5] }");
  EXPECT_TRUE(ValidateJobConfig(speeds).ok());
  EXPECT_EQ(RankBatchSizes(speeds), (std::vector<uint32_t>{2, 2, 2, 10}));
  EXPECT_THAT(
      ValidateJobConfig(Config(2, 2, "data { batch_size: 4 rank_speeds: [1, 1] }")).message(),
      HasSubstr("data.rank_speeds: must have one entry per worker: has 2"));
}

TEST(NodeConfigTest, AlgorithmsWithoutAnIntraNodeFormNeedLocalSizeOne) {
  for (const char* name : {"async-sgd", "gtopk-ssgd", "topk-ssgd"}) {
    SCOPED_TRACE(name);
    const std::string algorithm =
        absl::StrCat("data { batch_size: 4 }\nalgorithm { name: \"", name, "\" ",
                     std::string(name) == "async-sgd" ? "" : "density: 0.1 ", "}");
    // Valid flat: the refusal below is about local_size alone.
    EXPECT_TRUE(ValidateJobConfig(Config(2, 1, algorithm)).ok())
        << ValidateJobConfig(Config(2, 1, algorithm));
    const absl::Status status = ValidateJobConfig(Config(2, 2, algorithm));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("cluster.local_size: must be 1 with algorithm.name"));
    EXPECT_THAT(status.message(), HasSubstr(name));
  }
  for (const char* algorithm : {"name: \"ssgd\"", "name: \"local-sgd\" period: 4",
                                "name: \"cser\" period: 4 ratio_c1: 2 ratio_c2: 4"}) {
    SCOPED_TRACE(algorithm);
    const absl::Status status = ValidateJobConfig(Config(
        2, 2, absl::StrCat("data { batch_size: 4 }\nalgorithm { ", algorithm, " }")));
    EXPECT_TRUE(status.ok()) << status;
  }
}

}  // namespace
}  // namespace cserps
