// The small job the checkpoint tests train (2 shards, 2 workers, an MLP of
// 404 floats on 160 examples: 10 steps per epoch, 3 epochs; a step window
// of 4), with one algorithm and its optimizer settings.
#ifndef CSERPS_TESTS_INTEGRATION_CHECKPOINTED_JOB_H_
#define CSERPS_TESTS_INTEGRATION_CHECKPOINTED_JOB_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cserps/v1/config.pb.h"
#include "tools/cluster/in_process_cluster.h"

namespace cserps::testing {

struct AlgorithmCase {
  std::string name;       // the test's
  std::string optimizer;  // fields of optimizer { } besides lr
  std::string algorithm;  // fields of algorithm { } besides block_size
};

// The job `name` of `c`, with a checkpoint every `every_steps` steps in `dir`.
inline v1::JobConfig CheckpointedJob(const AlgorithmCase& c, const std::string& name,
                                     const std::string& dir, uint32_t every_steps) {
  return TestConfig(absl::StrCat(R"pb(
    name: ")pb", name, R"pb("
    seed: 5
    cluster {
      servers: "127.0.0.1:0"
      servers: "127.0.0.1:0"
      num_workers: 2
      round_timeout_s: 30
      # Below checkpoint.every_steps of the shard restart test: the sparse
      # exchange's PushPull rounds (checkpoints) are not its training rounds.
      max_step_lag: 4
    }
    model { kind: MLP hidden: 16 input_dim: 20 num_classes: 4 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 )pb", c.optimizer, R"pb( }
    algorithm { block_size: 8 )pb", c.algorithm, R"pb( }
    epochs: 3
    checkpoint { dir: ")pb", dir, R"pb(" every_steps: )pb", every_steps, R"pb( keep: 2 }
  )pb"));
}

}  // namespace cserps::testing

#endif  // CSERPS_TESTS_INTEGRATION_CHECKPOINTED_JOB_H_
