#include "worker/model/cpu_model.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "worker/model/conv2d_layer.h"
#include "worker/model/initialize.h"
#include "worker/model/linear_layer.h"
#include "worker/model/max_pool.h"
#include "worker/model/relu.h"
#include "worker/model/softmax_cross_entropy.h"

namespace cserps {
namespace {

MaxPoolShape PoolShape(const ConvLayerSpec& conv, size_t images) {
  return {images, conv.out_channels, conv.height, conv.width};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> MakeCpuModel(
    const v1::ModelConfig& config) {
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config));
  if (config.kind() == v1::ModelConfig::FLAT) {
    return absl::InvalidArgumentError(
        "model.kind: a FLAT model is computed by the front that trains it (the PyTorch "
        "front, docs/torch.md), not by cserps-worker");
  }
  return std::unique_ptr<Model>(new CpuModel(std::move(spec)));
}

CpuModel::CpuModel(ModelSpec spec)
    : spec_(std::move(spec)),
      activations_(spec_.layers.size()),
      pooled_(spec_.convs.size()),
      argmax_(spec_.convs.size()) {
  CSERPS_CHECK(!spec_.layers.empty());
  for (const ConvLayerSpec& conv : spec_.convs) {
    max_width_ = std::max({max_width_, conv.input_size(), conv.output_size()});
    max_conv_output_ = std::max(max_conv_output_, conv.conv_output_size());
  }
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
  const size_t group = std::min(rows, kConvGroupImages);
  size_t workspace = 0;
  for (size_t s = 0; s < spec_.convs.size(); ++s) {
    const ConvLayerSpec& conv = spec_.convs[s];
    pooled_[s].resize(rows * conv.output_size());
    argmax_[s].resize(rows * conv.output_size());
    workspace =
        std::max(workspace, Conv2dWorkspaceSize(StageShape(conv, group)));
  }
  conv_out_.resize(group * max_conv_output_);
  conv_workspace_.resize(workspace);
  scratch_rows_ = rows;
}

void CpuModel::EnsureGradientScratch(size_t rows) {
  if (rows <= gradient_rows_) return;
  grad_out_.resize(rows * max_width_);
  grad_in_.resize(rows * max_width_);
  gradient_rows_ = rows;
}

absl::Span<float> CpuModel::Pooled(size_t s, size_t rows) {
  return absl::MakeSpan(pooled_[s].data(),
                        rows * spec_.convs[s].output_size());
}

absl::Span<const float> CpuModel::StageInput(size_t s, const Batch& batch) {
  if (s == 0) return batch.features;
  return Pooled(s - 1, batch.size);
}

absl::Span<float> CpuModel::Activation(size_t l, size_t rows) {
  return absl::MakeSpan(activations_[l].data(), rows * spec_.layers[l].out);
}

absl::Span<const float> CpuModel::LayerInput(size_t l, const Batch& batch) {
  if (l > 0) return Activation(l - 1, batch.size);
  if (spec_.convs.empty()) return batch.features;
  return Pooled(spec_.convs.size() - 1, batch.size);
}

void CpuModel::ConvStageForward(size_t s, absl::Span<const float> params,
                                const Batch& batch) {
  const ConvLayerSpec& conv = spec_.convs[s];
  const absl::Span<const float> input = StageInput(s, batch);
  const absl::Span<float> pooled = Pooled(s, batch.size);
  const absl::Span<const float> w =
      params.subspan(conv.weight_offset, conv.weight_size());
  const absl::Span<const float> b =
      params.subspan(conv.bias_offset, conv.out_channels);
  for (size_t first = 0; first < batch.size; first += kConvGroupImages) {
    const size_t n = std::min(kConvGroupImages, batch.size - first);
    const Conv2dShape shape = StageShape(conv, n);
    const absl::Span<float> y =
        absl::MakeSpan(conv_out_.data(), n * conv.conv_output_size());
    Conv2dForward(shape, input.subspan(first * conv.input_size(),
                                       n * conv.input_size()),
                  w, b, y,
                  absl::MakeSpan(conv_workspace_.data(),
                                 Conv2dWorkspaceSize(shape)));
    // Pooling before the ReLU gives the same values (both are monotone) on
    // a quarter of the elements.
    MaxPoolForward(PoolShape(conv, n), y,
                   pooled.subspan(first * conv.output_size(),
                                  n * conv.output_size()),
                   absl::MakeSpan(argmax_[s]).subspan(first * conv.output_size(),
                                                      n * conv.output_size()));
  }
  ReluInPlace(pooled);
}

void CpuModel::ConvStageBackward(size_t s, absl::Span<const float> params,
                                 const Batch& batch,
                                 absl::Span<const float> dy,
                                 absl::Span<float> grad, absl::Span<float> dx) {
  const ConvLayerSpec& conv = spec_.convs[s];
  const absl::Span<const float> input = StageInput(s, batch);
  const absl::Span<const float> w =
      params.subspan(conv.weight_offset, conv.weight_size());
  const absl::Span<float> dw =
      grad.subspan(conv.weight_offset, conv.weight_size());
  const absl::Span<float> db =
      grad.subspan(conv.bias_offset, conv.out_channels);
  std::fill(dw.begin(), dw.end(), 0.0f);
  std::fill(db.begin(), db.end(), 0.0f);
  for (size_t first = 0; first < batch.size; first += kConvGroupImages) {
    const size_t n = std::min(kConvGroupImages, batch.size - first);
    const Conv2dShape shape = StageShape(conv, n);
    const absl::Span<float> dconv =
        absl::MakeSpan(conv_out_.data(), n * conv.conv_output_size());
    MaxPoolBackward(PoolShape(conv, n),
                    dy.subspan(first * conv.output_size(),
                               n * conv.output_size()),
                    absl::MakeConstSpan(argmax_[s]).subspan(
                        first * conv.output_size(), n * conv.output_size()),
                    dconv);
    absl::Span<float> dx_group;
    if (!dx.empty()) {
      dx_group = dx.subspan(first * conv.input_size(), n * conv.input_size());
    }
    Conv2dBackward(shape,
                   input.subspan(first * conv.input_size(),
                                 n * conv.input_size()),
                   w, dconv, dw, db, dx_group,
                   absl::MakeSpan(conv_workspace_.data(),
                                  Conv2dWorkspaceSize(shape)));
  }
}

absl::Span<const float> CpuModel::Forward(absl::Span<const float> params,
                                          const Batch& batch) {
  EnsureScratch(batch.size);
  for (size_t s = 0; s < spec_.convs.size(); ++s) {
    ConvStageForward(s, params, batch);
  }
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

absl::StatusOr<float> CpuModel::LossAndGradient(absl::Span<const float> params,
                                                const Batch& batch,
                                                absl::Span<float> grad) {
  CheckArguments(params, batch);
  CSERPS_CHECK(grad.size() == spec_.num_params);
  if (batch.size == 0) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return 0.0f;
  }
  const size_t rows = batch.size;
  const absl::Span<const float> logits = Forward(params, batch);
  EnsureGradientScratch(rows);
  absl::Span<float> dy = absl::MakeSpan(grad_out_.data(),
                                        rows * spec_.num_classes);
  const double loss_sum =
      SoftmaxCrossEntropy(logits, batch.labels, spec_.num_classes,
                          1.0f / static_cast<float>(rows), dy);
  // dy moves down through the linear layers, then the conv stages; every
  // input below the top is a ReLU output, whose mask dx gets on the way.
  for (size_t l = spec_.layers.size(); l-- > 0;) {
    const LinearLayerSpec& layer = spec_.layers[l];
    const bool needs_dx = l > 0 || !spec_.convs.empty();
    absl::Span<float> dx;
    if (needs_dx) dx = absl::MakeSpan(grad_in_.data(), rows * layer.in);
    LinearBackward({rows, layer.in, layer.out}, LayerInput(l, batch),
                   params.subspan(layer.weight_offset, layer.out * layer.in), dy,
                   grad.subspan(layer.weight_offset, layer.out * layer.in),
                   grad.subspan(layer.bias_offset, layer.out), dx);
    if (needs_dx) {
      ReluBackwardInPlace(LayerInput(l, batch), dx);
      // Swaps the buffers, not their contents: dx becomes the next layer's
      // dy, and the old dy buffer is free for the next dx.
      std::swap(grad_out_, grad_in_);
      dy = dx;
    }
  }
  for (size_t s = spec_.convs.size(); s-- > 0;) {
    absl::Span<float> dx;
    if (s > 0) {
      dx = absl::MakeSpan(grad_in_.data(), rows * spec_.convs[s].input_size());
    }
    ConvStageBackward(s, params, batch, dy, grad, dx);
    if (s > 0) {
      ReluBackwardInPlace(StageInput(s, batch), dx);
      std::swap(grad_out_, grad_in_);
      dy = dx;
    }
  }
  return static_cast<float>(loss_sum / static_cast<double>(rows));
}

absl::StatusOr<EvalSums> CpuModel::Evaluate(absl::Span<const float> params,
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
