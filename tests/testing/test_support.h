// Small helpers shared by several test binaries: servers without clients,
// comparing models and reading the trainer's summaries (and, through
// tools/cluster/random_dataset.h, synthetic data).
#ifndef CSERPS_TESTS_TESTING_TEST_SUPPORT_H_
#define CSERPS_TESTS_TESTING_TEST_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "server/ps_server.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/random_dataset.h"
#include "worker/trainer/trainer.h"

namespace cserps::testing {

// The server shards of a config on ephemeral 127.0.0.1 ports, whose
// addresses Start writes into the config (over whatever it listed);
// shut down by the destructor.
class ServerSet {
 public:
  absl::Status Start(v1::JobConfig* config, ParameterServerService::Options options = {});
  PsServer& shard(int s) { return *shards_[s]; }
  ~ServerSet();

 private:
  std::vector<std::unique_ptr<PsServer>> shards_;
};

// Direction(g) of ALGORITHMS.md, with the float expressions of the rule:
//   NONE:       p = g + λx
//   HEAVY_BALL: m ← βm + (g + λx); p = m
//   NESTEROV:   d = g + λx; m ← βm + d; p = d + βm
// written here from the rule, independently of common/direction.h.
class ReferenceDirection {
 public:
  ReferenceDirection(const v1::OptimizerConfig& optimizer, size_t num_params);
  std::vector<float> Compute(absl::Span<const float> g, absl::Span<const float> x);

 private:
  v1::OptimizerConfig::Momentum kind_;
  float beta_;
  float lambda_;
  std::vector<float> m_;
};

// ||a - b|| / ||b|| in double.
double RelativeL2(absl::Span<const float> a, absl::Span<const float> b);

// The whole file; empty when it cannot be read.
std::string ReadFile(const std::filesystem::path& path);

// The number after "key": in a summary JSON the trainer wrote; -1 when
// absent or not a number.
double JsonNumber(const std::string& json, const std::string& key);

// One Trainer per rank of `cluster`, on the rank's client, `train` and
// `test` (which outlive them).
absl::StatusOr<std::vector<std::unique_ptr<Trainer>>> TrainersOf(InProcessCluster& cluster,
                                                                 const Dataset& train,
                                                                 const Dataset& test);

}  // namespace cserps::testing

#endif  // CSERPS_TESTS_TESTING_TEST_SUPPORT_H_
