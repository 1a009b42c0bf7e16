// What the algorithm tests share: a small job, a synthetic gradient oracle,
// a driver that runs a registered algorithm on a real in-process cluster and
// records every rank's model after every step, and the reference arithmetic
// of ALGORITHMS.md (direction, weighted average, block ranges) written here
// from the rules, independently of worker/.
//
// The job: a SOFTMAX model 199 -> 10 (d = 2000 floats) in blocks of 32
// floats (63 blocks, the last one 16 floats), 2 server shards, so that GRBS
// ratios 4 and 8 select a real subset (16 and 8 blocks) spread over both
// shards.
#ifndef CSERPS_TESTS_WORKER_ALGORITHMS_ALGORITHM_HARNESS_H_
#define CSERPS_TESTS_WORKER_ALGORITHMS_ALGORITHM_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "worker/algorithms/algorithm.h"
#include "worker/device/host_device_ops.h"
#include "worker/group/local_group.h"
#include "worker/ps/communicator.h"
#include "worker/ps/forwarding_communicator.h"
#include "worker/ps/ps_client.h"

namespace cserps::testing {

// One model per rank, indexed by rank.
using Models = std::vector<std::vector<float>>;

// A job for `algorithm` (the body of an AlgorithmConfig in text format, e.g.
// `name: "cser" period: 4 ratio_c1: 4 ratio_c2: 8`) and `optimizer` (the
// body of an OptimizerConfig) with one worker per entry of `batch_sizes`
// (its weight), 2 shards, block_size 32 and round_timeout_s 10 (so a
// broken round fails the test fast instead of hanging it). Defaults applied;
// aborts on a config that does not parse.
v1::JobConfig MakeJobConfig(absl::string_view algorithm, absl::string_view optimizer,
                            const std::vector<uint32_t>& batch_sizes);

// d of `config`'s model.
size_t NumParams(const v1::JobConfig& config);

// The batch sizes (weights) of `config`, by rank.
std::vector<uint32_t> Weights(const v1::JobConfig& config);

// g_{i,t}(x) = c_i ⊙ x − b_i − n_{i,t}: a quadratic whose minimiser differs
// per rank, so local models drift apart, with c_i in [0.5, 1.5) (so
// x ← x − η·g contracts for η < 1.3), b_i in [−1, 1) and per-step noise
// n_{i,t} in [−0.25, 0.25), all from CounterRng. Deterministic in
// (rank, step, x), so a test can recompute any worker's gradient afterwards.
// Thread-safe (const).
class SyntheticGradients {
 public:
  SyntheticGradients(uint64_t seed, int num_ranks, size_t num_params);

  std::vector<float> At(int rank, uint64_t step, absl::Span<const float> x) const;

 private:
  uint64_t seed_;
  std::vector<std::vector<float>> c_;
  std::vector<std::vector<float>> b_;
};

// The model every rank starts from: uniform in [−1, 1).
std::vector<float> InitialModel(uint64_t seed, size_t num_params);

struct ClusterRun {
  // models[t][r]: rank r's parameters after step t.
  std::vector<Models> models;
  // With `finish`: every rank's parameters after Finish.
  Models finished;
  // The servers' model (PullModel) after the last step, or after Finish.
  std::vector<float> server_model;
};

// One process's algorithm (MakeAlgorithm of config.algorithm().name()) on
// host memory (HostDeviceOps), stepped with host vectors.
class RankAlgorithm {
 public:
  // `comm` (and `group`, for a local rank of a node) outlive it;
  // `steps_per_epoch` is the AlgorithmContext's.
  static absl::StatusOr<std::unique_ptr<RankAlgorithm>> Create(
      const v1::JobConfig& config, Communicator* comm, float weight,
      LocalGroup* group = nullptr, uint64_t steps_per_epoch = 0);
  // Algorithm::Step(t, lr, g, x) with g and x copied to and from the ops.
  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    std::vector<float>* x);
  absl::Status Finish(uint64_t steps, std::vector<float>* x);
  // A checkpoint's full average after `steps` steps, as the trainer takes it
  // (SettleForCheckpoint, then AverageForCheckpoint).
  absl::Status FullAverage(uint64_t steps, std::vector<float>* x);

 private:
  explicit RankAlgorithm(size_t num_params, uint32_t block_size)
      : ops_(num_params, block_size) {}

  HostDeviceOps ops_;
  DeviceVector x_, g_;
  std::unique_ptr<Algorithm> algorithm_;
};

// The communicator rank r's algorithm is given in place of its client (a
// recording wrapper, say); it outlives the run.
using CommWrapper = std::function<Communicator*(int rank, PsClient& client)>;

// Starts an in-process cluster for `config`, writes `x0` to the servers from
// rank 0, then runs `steps` steps of the algorithm on every rank (one
// thread each, a RankAlgorithm with weight = batch size, learning rate
// config.optimizer().lr()), from x0 with gradients from `gradients`. With
// `finish`, every rank then calls Finish(steps), as the trainer does (its
// step count). `wrap` null: every rank talks to its own client. After each
// step t in `full_averages_after`, every rank takes a checkpoint's full
// average (of t + 1 steps) before its model is recorded.
absl::StatusOr<ClusterRun> RunOnCluster(const v1::JobConfig& config,
                                        const SyntheticGradients& gradients,
                                        absl::Span<const float> x0, int steps,
                                        bool finish = false,
                                        const CommWrapper& wrap = nullptr,
                                        const std::set<int>& full_averages_after = {});

// The float ranges [begin, end) of the blocks GRBS(stream, step, ratio)
// selects in `config`'s job (SelectBlocks with the job seed; block b is
// [b·block_size, min(d, (b + 1)·block_size))), ascending.
std::vector<std::pair<size_t, size_t>> SelectedRanges(const v1::JobConfig& config,
                                                      int stream, uint64_t step,
                                                      uint32_t ratio);
// Every float of the job, as one range.
std::vector<std::pair<size_t, size_t>> AllRanges(const v1::JobConfig& config);

// AVG(v) = Σ w_i v_i / Σ w_i on the floats of `ranges`, accumulated in
// double and rounded to float once, as ALGORITHMS.md defines it; the other
// floats of the result are 0.
std::vector<float> WeightedMean(const Models& v, const std::vector<uint32_t>& weights,
                                const std::vector<std::pair<size_t, size_t>>& ranges);

// Σ w_i v_i / Σ w_i on every float, in double (no rounding to float).
std::vector<double> WeightedMeanExact(const Models& v,
                                      const std::vector<uint32_t>& weights);

// Normwise relative closeness: |actual_j − expected_j| <= rel·max_k
// |expected_k| for every j. Element-wise relative error would be meaningless
// for the floats that pass near 0; the models here are O(1), so this bounds
// every float's error by about rel.
::testing::AssertionResult AllNear(absl::Span<const float> actual,
                                   absl::Span<const float> expected, double rel);
::testing::AssertionResult AllNear(absl::Span<const double> actual,
                                   absl::Span<const double> expected, double rel);

// memcmp equality, reporting the first differing float.
::testing::AssertionResult BitEqual(absl::Span<const float> actual,
                                    absl::Span<const float> expected);

}  // namespace cserps::testing

#endif  // CSERPS_TESTS_WORKER_ALGORITHMS_ALGORITHM_HARNESS_H_
