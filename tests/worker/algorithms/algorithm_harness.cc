#include "tests/worker/algorithms/algorithm_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/grbs.h"
#include "common/model_spec.h"
#include "common/prng.h"
#include "common/status.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/algorithms/registry.h"

namespace cserps::testing {

v1::JobConfig MakeJobConfig(absl::string_view algorithm, absl::string_view optimizer,
                            const std::vector<uint32_t>& batch_sizes) {
  std::string sizes;
  for (uint32_t b : batch_sizes) absl::StrAppend(&sizes, " rank_batch_sizes: ", b);
  return TestConfig(absl::StrCat(
      "name: \"algorithm-test\" seed: 20240611 epochs: 1\n",
      "cluster { servers: \"127.0.0.1:0\" servers: \"127.0.0.1:0\" num_workers: ",
      batch_sizes.size(), " round_timeout_s: 10 }\n",
      "model { kind: SOFTMAX input_dim: 199 num_classes: 10 }\n",
      "data {", sizes, " }\n",
      "optimizer { ", optimizer, " }\n",
      "algorithm { block_size: 32 ", algorithm, " }\n"));
}

size_t NumParams(const v1::JobConfig& config) {
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(config.model());
  CSERPS_CHECK(spec.ok());
  return spec->num_params;
}

std::vector<uint32_t> Weights(const v1::JobConfig& config) {
  return RankBatchSizes(config);
}

SyntheticGradients::SyntheticGradients(uint64_t seed, int num_ranks, size_t num_params)
    : seed_(seed) {
  for (int r = 0; r < num_ranks; ++r) {
    CounterRng rng(DeriveKey(DeriveKey(seed, 1), static_cast<uint64_t>(r)));
    std::vector<float> c(num_params), b(num_params);
    for (size_t j = 0; j < num_params; ++j) {
      c[j] = 0.5f + rng.UniformFloat();
      b[j] = 2.0f * rng.UniformFloat() - 1.0f;
    }
    c_.push_back(std::move(c));
    b_.push_back(std::move(b));
  }
}

std::vector<float> SyntheticGradients::At(int rank, uint64_t step,
                                          absl::Span<const float> x) const {
  const std::vector<float>& c = c_[rank];
  const std::vector<float>& b = b_[rank];
  CSERPS_CHECK(x.size() == c.size());
  const uint64_t rank_key = DeriveKey(DeriveKey(seed_, 2), static_cast<uint64_t>(rank));
  CounterRng noise(DeriveKey(rank_key, step));
  std::vector<float> g(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    const float n = 0.5f * noise.UniformFloat() - 0.25f;
    g[j] = c[j] * x[j] - b[j] - n;
  }
  return g;
}

std::vector<float> InitialModel(uint64_t seed, size_t num_params) {
  CounterRng rng(DeriveKey(seed, 3));
  std::vector<float> x(num_params);
  for (float& v : x) v = 2.0f * rng.UniformFloat() - 1.0f;
  return x;
}

absl::StatusOr<std::unique_ptr<RankAlgorithm>> RankAlgorithm::Create(
    const v1::JobConfig& config, Communicator* comm, float weight, LocalGroup* group,
    uint64_t steps_per_epoch) {
  std::unique_ptr<RankAlgorithm> rank(
      new RankAlgorithm(comm->layout().num_params(), config.algorithm().block_size()));
  ASSIGN_OR_RETURN(rank->x_, rank->ops_.Allocate());
  ASSIGN_OR_RETURN(rank->g_, rank->ops_.Allocate());
  AlgorithmContext context;
  context.config = &config;
  context.comm = comm;
  context.ops = &rank->ops_;
  context.group = group;
  context.weight = weight;
  context.steps_per_epoch = steps_per_epoch;
  ASSIGN_OR_RETURN(rank->algorithm_, MakeAlgorithm(context));
  return rank;
}

absl::Status RankAlgorithm::Step(uint64_t t, float lr, absl::Span<const float> g,
                                 std::vector<float>* x) {
  RETURN_IF_ERROR(ops_.Upload(g, g_.data()));
  RETURN_IF_ERROR(ops_.Upload(*x, x_.data()));
  RETURN_IF_ERROR(algorithm_->Step(t, lr, g_.data(), x_.data()));
  return ops_.Download(x_.data(), absl::MakeSpan(*x));
}

absl::Status RankAlgorithm::Finish(uint64_t steps, std::vector<float>* x) {
  RETURN_IF_ERROR(ops_.Upload(*x, x_.data()));
  RETURN_IF_ERROR(algorithm_->Finish(steps, x_.data()));
  return ops_.Download(x_.data(), absl::MakeSpan(*x));
}

absl::Status RankAlgorithm::FullAverage(uint64_t steps, std::vector<float>* x) {
  RETURN_IF_ERROR(ops_.Upload(*x, x_.data()));
  RETURN_IF_ERROR(algorithm_->SettleForCheckpoint(x_.data()));
  RETURN_IF_ERROR(algorithm_->AverageForCheckpoint(steps, x_.data()));
  return ops_.Download(x_.data(), absl::MakeSpan(*x));
}

absl::StatusOr<ClusterRun> RunOnCluster(const v1::JobConfig& config,
                                        const SyntheticGradients& gradients,
                                        absl::Span<const float> x0, int steps,
                                        bool finish, const CommWrapper& wrap,
                                        const std::set<int>& full_averages_after) {
  const size_t d = NumParams(config);
  if (x0.size() != d) {
    return absl::InvalidArgumentError(
        absl::StrCat("x0 has ", x0.size(), " floats, the model ", d));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster,
                   InProcessCluster::Start(config, d));
  const v1::JobConfig& job = cluster->config();
  const int n = cluster->num_workers();
  const std::vector<uint32_t> weights = Weights(job);
  const float lr = job.optimizer().lr();
  RETURN_IF_ERROR(cluster->client(0).PushModel(x0));

  ClusterRun run;
  run.models.assign(steps, Models(n));
  if (finish) run.finished.assign(n, {});
  // Each rank writes only its own slots of `run`, which are sized above.
  RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) -> absl::Status {
    Communicator* comm = wrap ? wrap(r, cluster->client(r)) : &cluster->client(r);
    ASSIGN_OR_RETURN(std::unique_ptr<RankAlgorithm> algorithm,
                     RankAlgorithm::Create(job, comm, static_cast<float>(weights[r])));
    std::vector<float> x(x0.begin(), x0.end());
    for (int t = 0; t < steps; ++t) {
      const absl::Status status = algorithm->Step(t, lr, gradients.At(r, t, x), &x);
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("step ", t, ": ", status.message()));
      }
      if (full_averages_after.count(t) != 0) {
        const absl::Status status = algorithm->FullAverage(t + 1, &x);
        if (!status.ok()) {
          return absl::Status(status.code(),
                              absl::StrCat("full average after step ", t, ": ", status.message()));
        }
      }
      run.models[t][r] = x;
    }
    if (finish) {
      const absl::Status status = algorithm->Finish(steps, &x);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("Finish: ", status.message()));
      }
      run.finished[r] = x;
    }
    return absl::OkStatus();
  }));
  run.server_model.resize(d);
  RETURN_IF_ERROR(cluster->client(0).PullModel(absl::MakeSpan(run.server_model),
                                               /*wait_for_init=*/false));
  return run;
}

std::vector<std::pair<size_t, size_t>> SelectedRanges(const v1::JobConfig& config,
                                                      int stream, uint64_t step,
                                                      uint32_t ratio) {
  const size_t d = NumParams(config);
  const size_t bs = config.algorithm().block_size();
  const size_t num_blocks = (d + bs - 1) / bs;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (uint64_t b : SelectBlocks(config.seed(), stream, step, ratio, num_blocks)) {
    ranges.emplace_back(b * bs, std::min(d, (b + 1) * bs));
  }
  return ranges;
}

std::vector<std::pair<size_t, size_t>> AllRanges(const v1::JobConfig& config) {
  return {{0, NumParams(config)}};
}

std::vector<float> WeightedMean(const Models& v, const std::vector<uint32_t>& weights,
                                const std::vector<std::pair<size_t, size_t>>& ranges) {
  CSERPS_CHECK(v.size() == weights.size() && !v.empty());
  double total = 0;
  for (uint32_t w : weights) total += w;
  std::vector<float> mean(v[0].size(), 0.0f);
  for (const auto& [begin, end] : ranges) {
    for (size_t j = begin; j < end; ++j) {
      double sum = 0;
      for (size_t i = 0; i < v.size(); ++i) sum += static_cast<double>(weights[i]) * v[i][j];
      mean[j] = static_cast<float>(sum / total);
    }
  }
  return mean;
}

std::vector<double> WeightedMeanExact(const Models& v,
                                      const std::vector<uint32_t>& weights) {
  CSERPS_CHECK(v.size() == weights.size() && !v.empty());
  double total = 0;
  for (uint32_t w : weights) total += w;
  std::vector<double> mean(v[0].size(), 0.0);
  for (size_t j = 0; j < mean.size(); ++j) {
    double sum = 0;
    for (size_t i = 0; i < v.size(); ++i) sum += static_cast<double>(weights[i]) * v[i][j];
    mean[j] = sum / total;
  }
  return mean;
}

namespace {

template <typename T>
::testing::AssertionResult AllNearImpl(absl::Span<const T> actual,
                                       absl::Span<const T> expected, double rel) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  double scale = 0;
  for (T e : expected) scale = std::max(scale, std::fabs(double{e}));
  const double bound = rel * scale;
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t j = 0; j < actual.size(); ++j) {
    const double err = std::fabs(double{actual[j]} - double{expected[j]});
    // Written so that a NaN fails.
    if (!(err <= bound)) {
      if (bad++ == 0) first = j;
      worst = std::max(worst, err);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " floats off by more than " << bound
         << " (rel " << rel << " of max |expected| " << scale << "); first at " << first
         << ": " << actual[first] << " vs expected " << expected[first]
         << "; worst error " << worst;
}

}  // namespace

::testing::AssertionResult AllNear(absl::Span<const float> actual,
                                   absl::Span<const float> expected, double rel) {
  return AllNearImpl(actual, expected, rel);
}

::testing::AssertionResult AllNear(absl::Span<const double> actual,
                                   absl::Span<const double> expected, double rel) {
  return AllNearImpl(actual, expected, rel);
}

::testing::AssertionResult BitEqual(absl::Span<const float> actual,
                                    absl::Span<const float> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  if (std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)) == 0) {
    return ::testing::AssertionSuccess();
  }
  size_t bad = 0, first = 0;
  for (size_t j = 0; j < actual.size(); ++j) {
    if (std::memcmp(&actual[j], &expected[j], sizeof(float)) != 0 && bad++ == 0) first = j;
  }
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " floats differ; first at " << first << ": "
         << actual[first] << " vs " << expected[first] << " (diff "
         << double{actual[first]} - double{expected[first]} << ")";
}

}  // namespace cserps::testing
