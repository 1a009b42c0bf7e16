// The CPU backend of Model: linear layers with OpenBLAS sgemm, ReLU between
// them, softmax cross-entropy on top. Construct it through MakeCpuModel
// (model.h).
//
// Scratch buffers (activations and back-propagated gradients) grow to the
// largest batch seen and are reused, so steps allocate nothing once a batch
// of that size has been processed.
#ifndef CSERPS_WORKER_MODEL_CPU_MODEL_H_
#define CSERPS_WORKER_MODEL_CPU_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/model_spec.h"
#include "worker/data/batch.h"
#include "worker/model/model.h"

namespace cserps {

class CpuModel final : public Model {
 public:
  // `spec` must come from MakeModelSpec (at least one layer).
  explicit CpuModel(ModelSpec spec);

  const ModelSpec& spec() const override { return spec_; }
  void Initialize(uint64_t seed, absl::Span<float> params) const override;
  float LossAndGradient(absl::Span<const float> params, const Batch& batch,
                        absl::Span<float> grad) override;
  EvalSums Evaluate(absl::Span<const float> params,
                    const Batch& batch) override;

 private:
  void CheckArguments(absl::Span<const float> params, const Batch& batch) const;
  void EnsureScratch(size_t rows);
  // Runs the forward pass into activations_ and returns the logits
  // (batch.size x num_classes).
  absl::Span<const float> Forward(absl::Span<const float> params,
                                  const Batch& batch);
  // Output of layer l for the current batch (post-ReLU except the last).
  absl::Span<float> Activation(size_t l, size_t rows);
  // The input of layer l: the batch features for l == 0.
  absl::Span<const float> LayerInput(size_t l, const Batch& batch);

  ModelSpec spec_;
  size_t max_width_ = 0;  // widest layer output or input
  size_t scratch_rows_ = 0;
  std::vector<std::vector<float>> activations_;  // one per layer
  // d(loss)/d(activation), alternating between layers during backward.
  std::vector<float> grad_out_;
  std::vector<float> grad_in_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_CPU_MODEL_H_
