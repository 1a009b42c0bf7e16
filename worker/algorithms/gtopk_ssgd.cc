// gTop-k S-SGD (gtopk-ssgd; the gTop-k paper's Algorithm 1) and Top-k S-SGD
// (topk-ssgd), ALGORITHMS.md. The worker's side of both is the same code:
// only the servers' choice of G differs (the global top-k of the sum, or the
// union of the members' indices, which contains I_i so that gMask = I_i).
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/status.h"
#include "worker/algorithms/factories.h"
#include "worker/topk_select.h"

namespace cserps {
namespace {

class SparseTopkSsgd final : public Algorithm {
 public:
  explicit SparseTopkSsgd(const AlgorithmContext& context)
      : Algorithm(context),
        momentum_kind_(context.config->optimizer().momentum_kind()),
        beta_(context.config->optimizer().momentum()),
        lambda_(context.config->optimizer().weight_decay()),
        members_(static_cast<float>(context.config->cluster().num_workers())),
        k_(SparseK(context.algorithm(), context.num_params())),
        residual_(context.num_params(), 0.0f) {
    if (HasMomentum()) momentum_.assign(context.num_params(), 0.0f);
  }

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    const BlockLayout& layout = *context_.layout;
    const uint64_t d = layout.num_params();
    // Line 3: acc = ε + α·G(v); G with weight decay, no momentum (that comes
    // after aggregation). residual_ holds acc until line 5.
    for (uint64_t j = 0; j < d; ++j) {
      const float p = g[j] + lambda_ * x[j];
      residual_[j] = residual_[j] + lr * p;
    }
    // Line 4, this worker's part: its top-k_s of |acc| within every shard.
    local_.indices.clear();
    local_.values.clear();
    for (uint32_t s = 0; s < layout.num_shards(); ++s) {
      const uint64_t first = layout.ShardFirstFloat(s), size = layout.ShardSize(s);
      if (size == 0) continue;
      SelectTopK(absl::MakeConstSpan(residual_).subspan(first, size),
                 ShardSparseK(k_, size, d), &positions_);
      for (uint32_t pos : positions_) {
        local_.indices.push_back(static_cast<uint32_t>(first + pos));
        local_.values.push_back(residual_[first + pos]);
      }
    }
    RETURN_IF_ERROR(context_.comm->ExchangeSparse(t, local_, &global_));
    // Line 5: ε = acc ⊙ ¬gMask with gMask = I ∩ G: a local top-k entry that
    // was not chosen globally stays in the residual, as does every entry of
    // G that this worker did not push.
    size_t i = 0;
    for (uint32_t index : local_.indices) {
      while (i < global_.indices.size() && global_.indices[i] < index) ++i;
      if (i < global_.indices.size() && global_.indices[i] == index) residual_[index] = 0.0f;
    }
    // Line 6: v -= (1/P)·g on G (the servers apply the same expression).
    if (!HasMomentum()) {
      for (size_t e = 0; e < global_.indices.size(); ++e) {
        x[global_.indices[e]] -= global_.values[e] / members_;
      }
      return absl::OkStatus();
    }
    // Momentum on the aggregated update u = g/P, identical on every worker
    // and on the servers: m ← βm + u; heavy ball v -= m, Nesterov
    // v -= u + βm.
    update_.assign(d, 0.0f);
    for (size_t e = 0; e < global_.indices.size(); ++e) {
      update_[global_.indices[e]] = global_.values[e] / members_;
    }
    for (uint64_t j = 0; j < d; ++j) {
      momentum_[j] = beta_ * momentum_[j] + update_[j];
      x[j] -= momentum_kind_ == v1::OptimizerConfig::NESTEROV
                  ? update_[j] + beta_ * momentum_[j]
                  : momentum_[j];
    }
    return absl::OkStatus();
  }

  // The servers apply the same update (momentum included) and hold the
  // workers' common model bit for bit.
  absl::Status Finish(uint64_t, absl::Span<float>) override { return absl::OkStatus(); }

 private:
  bool HasMomentum() const {
    return momentum_kind_ == v1::OptimizerConfig::HEAVY_BALL ||
           momentum_kind_ == v1::OptimizerConfig::NESTEROV;
  }

  const v1::OptimizerConfig::Momentum momentum_kind_;
  const float beta_;
  const float lambda_;
  const float members_;
  const uint64_t k_;
  std::vector<float> residual_;  // ε_i
  std::vector<float> momentum_;
  std::vector<float> update_;
  std::vector<uint32_t> positions_;
  SparseVector local_;
  SparseVector global_;
};

absl::StatusOr<std::unique_ptr<Algorithm>> MakeSparse(const AlgorithmContext& context) {
  if (context.num_params() > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.name: ", context.algorithm().name(),
        " sends uint32 indices, but the model has ", context.num_params(),
        " floats (at most 2^32)"));
  }
  return std::unique_ptr<Algorithm>(new SparseTopkSsgd(context));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeGtopkSsgd(const AlgorithmContext& context) {
  return MakeSparse(context);
}

absl::StatusOr<std::unique_ptr<Algorithm>> MakeTopkSsgd(const AlgorithmContext& context) {
  return MakeSparse(context);
}

}  // namespace cserps
