#include "common/model_spec.h"

#include "absl/strings/str_cat.h"

namespace cserps {

absl::StatusOr<ModelSpec> MakeModelSpec(const v1::ModelConfig& config) {
  ModelSpec spec;
  spec.input_dim = config.input_dim() == 0 ? 784 : config.input_dim();
  spec.num_classes = config.num_classes() == 0 ? 10 : config.num_classes();
  std::vector<size_t> widths = {spec.input_dim};
  switch (config.kind()) {
    case v1::ModelConfig::SOFTMAX:
      if (config.hidden_size() != 0) {
        return absl::InvalidArgumentError(
            "model.hidden: a SOFTMAX model has no hidden layers");
      }
      break;
    case v1::ModelConfig::MLP:
      if (config.hidden_size() == 0) {
        return absl::InvalidArgumentError(
            "model.hidden: an MLP needs at least one hidden width");
      }
      for (int i = 0; i < config.hidden_size(); ++i) {
        if (config.hidden(i) == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.hidden[", i, "]: width must be > 0"));
        }
        widths.push_back(config.hidden(i));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          "model.kind: must be SOFTMAX or MLP");
  }
  widths.push_back(spec.num_classes);
  size_t offset = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    LinearLayerSpec layer;
    layer.in = widths[l];
    layer.out = widths[l + 1];
    layer.weight_offset = offset;
    offset += layer.in * layer.out;
    layer.bias_offset = offset;
    offset += layer.out;
    spec.layers.push_back(layer);
  }
  spec.num_params = offset;
  return spec;
}

}  // namespace cserps
