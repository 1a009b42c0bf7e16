// gTop-k S-SGD (gtopk-ssgd; the gTop-k paper's Algorithm 1) and Top-k S-SGD
// (topk-ssgd), ALGORITHMS.md. The worker's side of both is the same code:
// only the servers' choice of G differs (the global top-k of the sum, or the
// union of the members' indices, which contains I_i so that gMask = I_i).
// The accumulator stays on the device and is searched there; only the k
// chosen entries cross to the host and back.
#include <cstdint>
#include <vector>

#include "common/algorithm_catalog.h"
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class SparseTopkSsgd final : public Algorithm {
 public:
  explicit SparseTopkSsgd(const AlgorithmContext& context)
      : Algorithm(context, {&residual_}, {}, /*staging_devices=*/0),
        members_(static_cast<float>(context.config->cluster().num_workers())) {
    const BlockLayout& layout = context.comm->layout();
    const uint64_t k = SparseK(context.config->algorithm(), layout.num_params());
    for (uint32_t s = 0; s < layout.num_shards(); ++s) {
      const uint64_t size = layout.ShardSize(s);
      if (size == 0) continue;
      ranges_.push_back({layout.ShardFirstFloat(s), size,
                         ShardSparseK(k, size, layout.num_params())});
    }
  }

  // The momentum comes after aggregation, with its update on a buffer of
  // its own.
  absl::Status Init() override {
    RETURN_IF_ERROR(Algorithm::Init());
    if (momentum() == nullptr) return absl::OkStatus();
    return Allocate(&update_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // Line 3: acc = ε + α·G(v), G with weight decay; residual_ holds acc
    // until line 5.
    RETURN_IF_ERROR(ops().Accumulate(lr, rule().weight_decay, g, x, residual_.data()));
    // Line 4, this worker's part: its top-k_s of |acc| within every shard.
    RETURN_IF_ERROR(ops().TopK(residual_.data(), ranges_, &local_));
    RETURN_IF_ERROR(comm().ExchangeSparse(t, local_, &global_));
    // Line 5: ε = acc ⊙ ¬gMask with gMask = I ∩ G: a local top-k entry not
    // chosen globally stays in the residual, as does every entry of G that
    // this worker did not push.
    chosen_.clear();
    size_t i = 0;
    for (uint32_t index : local_.indices) {
      while (i < global_.indices.size() && global_.indices[i] < index) ++i;
      if (i < global_.indices.size() && global_.indices[i] == index) chosen_.push_back(index);
    }
    RETURN_IF_ERROR(ops().ScatterSparse(SparseOp::kZero, chosen_, {}, 0, residual_.data()));
    // Line 6: v -= (1/P)·g on G, as the servers do.
    if (momentum() == nullptr) {
      return ops().ScatterSparse(SparseOp::kSubtractDivided, global_.indices,
                                 global_.values, members_, x);
    }
    // With momentum, on the aggregated update u = g/P (zero off G), the same
    // on every worker and the servers: m ← βm + u; heavy ball v -= m,
    // Nesterov v -= u + βm. update_ is zero between steps.
    RETURN_IF_ERROR(ops().ScatterSparse(SparseOp::kAssignDivided, global_.indices,
                                        global_.values, members_, update_.data()));
    RETURN_IF_ERROR(ops().ApplyMomentum(rule(), update_.data(), momentum(), x));
    return ops().ScatterSparse(SparseOp::kZero, global_.indices, {}, 0, update_.data());
  }

  // The servers apply the same update (momentum included) and hold the
  // workers' common model bit for bit.
  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

  // A step that failed between writing u on G and zeroing it (a device
  // error before a roll back) left u nonzero there, which later steps would
  // apply again.
  absl::Status ResumeAfter(uint64_t) override {
    if (momentum() == nullptr) return absl::OkStatus();
    return ops().ScatterSparse(SparseOp::kZero, global_.indices, {}, 0, update_.data());
  }

 private:
  const float members_;
  std::vector<TopKRange> ranges_;  // one per non-empty shard
  DeviceVector residual_;          // ε_i
  DeviceVector update_;            // u, with momentum only
  SparseVector local_;
  SparseVector global_;
  std::vector<uint32_t> chosen_;  // I ∩ G
};

}  // namespace

std::unique_ptr<Algorithm> MakeGtopkSsgd(const AlgorithmContext& context) {
  return std::make_unique<SparseTopkSsgd>(context);
}

std::unique_ptr<Algorithm> MakeTopkSsgd(const AlgorithmContext& context) {
  return std::make_unique<SparseTopkSsgd>(context);
}

}  // namespace cserps
