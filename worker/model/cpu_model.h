// The CPU backend of Model: for a CNN, conv stages (im2col + OpenBLAS sgemm,
// ReLU, 2x2 max-pool); then linear layers with OpenBLAS sgemm, ReLU between
// them, softmax cross-entropy on top. Construct it through MakeCpuModel
// (model.h).
//
// Scratch buffers (activations, pooling choices, conv workspace and
// back-propagated gradients) grow to the largest batch seen and are reused,
// so steps allocate nothing once a batch of that size has been processed.
// Conv stages run on groups of at most kConvGroupImages images, which bounds
// the im2col workspace however large the batch (evaluation uses 1000).
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
  // Images per im2col + sgemm call of a conv stage. Larger groups mean
  // larger sgemms but a workspace that falls out of cache: 8 measured
  // fastest on one core for the 28 x 28 CNNs (16 and 32 were 5-15% slower).
  static constexpr size_t kConvGroupImages = 8;

  // `spec` must come from MakeModelSpec (at least one linear layer).
  explicit CpuModel(ModelSpec spec);

  const ModelSpec& spec() const override { return spec_; }
  void Initialize(uint64_t seed, absl::Span<float> params) const override;
  // Never fail: every error of the CPU model is a programmer error.
  absl::StatusOr<float> LossAndGradient(absl::Span<const float> params,
                                        const Batch& batch,
                                        absl::Span<float> grad) override;
  absl::StatusOr<EvalSums> Evaluate(absl::Span<const float> params,
                                    const Batch& batch) override;

 private:
  void CheckArguments(absl::Span<const float> params, const Batch& batch) const;
  void EnsureScratch(size_t rows);
  void EnsureGradientScratch(size_t rows);
  // Runs the forward pass into pooled_ and activations_ and returns the
  // logits (batch.size x num_classes).
  absl::Span<const float> Forward(absl::Span<const float> params,
                                  const Batch& batch);
  // Conv stage s on StageInput(s) into Pooled(s) (post-ReLU).
  void ConvStageForward(size_t s, absl::Span<const float> params,
                        const Batch& batch);
  // Given dy = dL/d(Pooled(s)) before the ReLU mask, the stage's weight and
  // bias gradients into `grad` and, for s > 0, dL/d(StageInput(s)) into dx.
  void ConvStageBackward(size_t s, absl::Span<const float> params,
                         const Batch& batch, absl::Span<const float> dy,
                         absl::Span<float> grad, absl::Span<float> dx);
  // Output of conv stage s after pooling and ReLU.
  absl::Span<float> Pooled(size_t s, size_t rows);
  absl::Span<const float> StageInput(size_t s, const Batch& batch);
  // Output of layer l for the current batch (post-ReLU except the last).
  absl::Span<float> Activation(size_t l, size_t rows);
  // The input of linear layer l: the batch features or the last conv
  // stage's output for l == 0.
  absl::Span<const float> LayerInput(size_t l, const Batch& batch);

  ModelSpec spec_;
  size_t max_width_ = 0;  // widest layer or stage output or input
  size_t max_conv_output_ = 0;  // largest conv output per image
  size_t scratch_rows_ = 0;
  size_t gradient_rows_ = 0;
  std::vector<std::vector<float>> activations_;  // one per linear layer
  std::vector<std::vector<float>> pooled_;       // one per conv stage
  std::vector<std::vector<uint8_t>> argmax_;     // one per conv stage
  // One group's conv output in the forward pass, its gradient in backward.
  std::vector<float> conv_out_;
  std::vector<float> conv_workspace_;
  // d(loss)/d(activation), alternating between layers during backward.
  std::vector<float> grad_out_;
  std::vector<float> grad_in_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_CPU_MODEL_H_
