// The flat parameter layout of a model: its tensors concatenated in a fixed
// order. Servers use it to know the model size d; workers to find tensors.
//
// Layout (docs/protocol.md, "Model layout"): for each linear layer l in
// input-to-output order, the weight matrix W_l (out_l rows x in_l columns,
// row-major) then the bias b_l (out_l floats). SOFTMAX is one linear layer
// input_dim -> num_classes; MLP has one linear layer per hidden width and a
// final one to num_classes, with ReLU between layers.
#ifndef CSERPS_COMMON_MODEL_SPEC_H_
#define CSERPS_COMMON_MODEL_SPEC_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

struct LinearLayerSpec {
  size_t in = 0;
  size_t out = 0;
  size_t weight_offset = 0;  // W: out x in, row-major
  size_t bias_offset = 0;    // b: out
};

struct ModelSpec {
  size_t input_dim = 0;
  size_t num_classes = 0;
  std::vector<LinearLayerSpec> layers;  // ReLU between consecutive layers
  size_t num_params = 0;
};

// Builds the layout of `config`; the error names the offending field.
absl::StatusOr<ModelSpec> MakeModelSpec(const v1::ModelConfig& config);

}  // namespace cserps

#endif  // CSERPS_COMMON_MODEL_SPEC_H_
