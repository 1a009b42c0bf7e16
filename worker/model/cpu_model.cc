#include "worker/model/cpu_model.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "worker/model/initialize.h"
#include "worker/model/linear_layer.h"
#include "worker/model/relu.h"
#include "worker/model/softmax_cross_entropy.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<Model>> MakeCpuModel(
    const v1::ModelConfig& config) {
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config));
  return std::unique_ptr<Model>(new CpuModel(std::move(spec)));
}

CpuModel::CpuModel(ModelSpec spec)
    : spec_(std::move(spec)), activations_(spec_.layers.size()) {
  CSERPS_CHECK(!spec_.layers.empty());
  for (const LinearLayerSpec& layer : spec_.layers) {
    max_width_ = std::max({max_width_, layer.in, layer.out});
  }
}

void CpuModel::Initialize(uint64_t seed, absl::Span<float> params) const {
  InitializeParameters(spec_, seed, params);
}

void CpuModel::CheckArguments(absl::Span<const float> params,
                              const Batch& batch) const {
  CSERPS_CHECK(params.size() == spec_.num_params);
  CSERPS_CHECK(batch.dim == spec_.input_dim);
  CSERPS_CHECK(batch.features.size() == batch.size * batch.dim);
  CSERPS_CHECK(batch.labels.size() == batch.size);
}

void CpuModel::EnsureScratch(size_t rows) {
  if (rows <= scratch_rows_) return;
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    activations_[l].resize(rows * spec_.layers[l].out);
  }
  grad_out_.resize(rows * max_width_);
  grad_in_.resize(rows * max_width_);
  scratch_rows_ = rows;
}

absl::Span<float> CpuModel::Activation(size_t l, size_t rows) {
  return absl::MakeSpan(activations_[l].data(), rows * spec_.layers[l].out);
}

absl::Span<const float> CpuModel::LayerInput(size_t l, const Batch& batch) {
  if (l == 0) return batch.features;
  return Activation(l - 1, batch.size);
}

absl::Span<const float> CpuModel::Forward(absl::Span<const float> params,
                                          const Batch& batch) {
  EnsureScratch(batch.size);
  const size_t num_layers = spec_.layers.size();
  for (size_t l = 0; l < num_layers; ++l) {
    const LinearLayerSpec& layer = spec_.layers[l];
    const absl::Span<float> y = Activation(l, batch.size);
    LinearForward({batch.size, layer.in, layer.out}, LayerInput(l, batch),
                  params.subspan(layer.weight_offset, layer.out * layer.in),
                  params.subspan(layer.bias_offset, layer.out), y);
    if (l + 1 < num_layers) ReluInPlace(y);
  }
  return Activation(num_layers - 1, batch.size);
}

float CpuModel::LossAndGradient(absl::Span<const float> params,
                                const Batch& batch, absl::Span<float> grad) {
  CheckArguments(params, batch);
  CSERPS_CHECK(grad.size() == spec_.num_params);
  if (batch.size == 0) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return 0.0f;
  }
  const size_t rows = batch.size;
  const absl::Span<const float> logits = Forward(params, batch);
  absl::Span<float> dy = absl::MakeSpan(grad_out_.data(),
                                        rows * spec_.num_classes);
  const double loss_sum =
      SoftmaxCrossEntropy(logits, batch.labels, spec_.num_classes,
                          1.0f / static_cast<float>(rows), dy);
  for (size_t l = spec_.layers.size(); l-- > 0;) {
    const LinearLayerSpec& layer = spec_.layers[l];
    absl::Span<float> dx;
    if (l > 0) dx = absl::MakeSpan(grad_in_.data(), rows * layer.in);
    LinearBackward({rows, layer.in, layer.out}, LayerInput(l, batch),
                   params.subspan(layer.weight_offset, layer.out * layer.in), dy,
                   grad.subspan(layer.weight_offset, layer.out * layer.in),
                   grad.subspan(layer.bias_offset, layer.out), dx);
    if (l > 0) {
      ReluBackwardInPlace(Activation(l - 1, rows), dx);
      // Swaps the buffers, not their contents: dx becomes the next layer's
      // dy, and the old dy buffer is free for the next dx.
      std::swap(grad_out_, grad_in_);
      dy = dx;
    }
  }
  return static_cast<float>(loss_sum / static_cast<double>(rows));
}

EvalSums CpuModel::Evaluate(absl::Span<const float> params,
                            const Batch& batch) {
  CheckArguments(params, batch);
  EvalSums sums;
  if (batch.size == 0) return sums;
  const absl::Span<const float> logits = Forward(params, batch);
  sums.loss_sum = SoftmaxCrossEntropy(logits, batch.labels, spec_.num_classes,
                                      0.0f, absl::Span<float>());
  sums.correct = CountTop1Correct(logits, batch.labels, spec_.num_classes);
  sums.count = batch.size;
  return sums;
}

}  // namespace cserps
