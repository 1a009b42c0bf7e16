// The flat parameter layout of a model: its tensors concatenated in a fixed
// order. Servers use it to know the model size d; workers to find tensors.
//
// Layout (docs/protocol.md, "Model layout"): first, for each conv stage c of
// a CNN in input-to-output order, the kernel K_c ([out][in][kernel][kernel],
// row-major) then the bias (out floats); then, for each linear layer l in
// input-to-output order, the weight matrix W_l (out_l rows x in_l columns,
// row-major) then the bias b_l (out_l floats). SOFTMAX is one linear layer
// input_dim -> num_classes; MLP has one linear layer per hidden width and a
// final one to num_classes, with ReLU between layers; CNN has its conv stages
// and one linear layer from the last stage's flattened output to
// num_classes. SOFTMAX and MLP have no conv stages.
#ifndef CSERPS_COMMON_MODEL_SPEC_H_
#define CSERPS_COMMON_MODEL_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// One conv stage of a CNN: convolution of an in_channels x height x width
// image (stride 1, 'same' zero padding of (kernel - 1) / 2 on every side, so
// the output is out_channels x height x width), plus bias, ReLU, then 2x2
// max-pooling with stride 2 to out_channels x pooled_height x pooled_width
// (height / 2 and width / 2 rounded down: an odd last row or column is
// dropped). Images are stored channel, row, column (NCHW for a batch).
struct ConvLayerSpec {
  size_t in_channels = 0;
  size_t out_channels = 0;
  size_t kernel = 0;  // odd
  size_t height = 0;  // of the stage's input and of the convolution's output
  size_t width = 0;
  size_t pooled_height = 0;
  size_t pooled_width = 0;
  // K: out_channels x in_channels x kernel x kernel, row-major: element
  // (o, i, ky, kx) at weight_offset + ((o * in_channels + i) * kernel + ky) *
  // kernel + kx. It multiplies input pixel (i, y + ky - pad, x + kx - pad)
  // for output pixel (o, y, x) (cross-correlation, as in every DL library).
  size_t weight_offset = 0;
  size_t bias_offset = 0;  // b: out_channels

  size_t input_size() const { return in_channels * height * width; }
  size_t conv_output_size() const { return out_channels * height * width; }
  size_t output_size() const {
    return out_channels * pooled_height * pooled_width;
  }
  size_t weight_size() const {
    return out_channels * in_channels * kernel * kernel;
  }
};

struct LinearLayerSpec {
  size_t in = 0;
  size_t out = 0;
  size_t weight_offset = 0;  // W: out x in, row-major
  size_t bias_offset = 0;    // b: out
};

struct ModelSpec {
  size_t input_dim = 0;
  size_t num_classes = 0;
  // CNN stages, input to output; empty for SOFTMAX and MLP. The first
  // stage's input_size() is input_dim; each next stage's input is the
  // previous output; the first linear layer's `in` is the last output_size().
  std::vector<ConvLayerSpec> convs;
  std::vector<LinearLayerSpec> layers;  // ReLU between consecutive layers
  size_t num_params = 0;
};

// The defaults of the CNN fields of v1::ModelConfig (config.proto).
inline constexpr uint32_t kDefaultConvChannels[] = {16, 32};
inline constexpr uint32_t kDefaultKernelSize = 5;
inline constexpr uint32_t kDefaultImageHeight = 28;
inline constexpr uint32_t kDefaultImageWidth = 28;
inline constexpr uint32_t kDefaultImageChannels = 1;

// Builds the layout of `config`, applying the defaults of config.proto to
// fields left at zero/empty (input_dim, num_classes and, for a CNN,
// conv_channels, kernel_size and the image shape). INVALID_ARGUMENT whose
// message starts with the offending field, e.g. "model.conv_channels[1]: must
// be > 0 (got 0)" or "model.input_dim: 784 != image_height * image_width *
// image_channels = 900 (30 * 30 * 1)"; also when the parameter count would
// not fit in 64 bits.
absl::StatusOr<ModelSpec> MakeModelSpec(const v1::ModelConfig& config);

}  // namespace cserps

#endif  // CSERPS_COMMON_MODEL_SPEC_H_
