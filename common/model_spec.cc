#include "common/model_spec.h"

#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Sizes come from uint32 fields, so products can exceed 64 bits.
absl::StatusOr<size_t> Multiply(size_t a, size_t b, absl::string_view field) {
  size_t product;
  if (__builtin_mul_overflow(a, b, &product)) {
    return Invalid(field, absl::StrCat(a, " * ", b, " overflows 64 bits"));
  }
  return product;
}

// Reserves `count` floats at the end of the layout so far.
absl::StatusOr<size_t> Reserve(size_t* offset, size_t count,
                               absl::string_view field) {
  const size_t start = *offset;
  if (__builtin_add_overflow(*offset, count, offset)) {
    return Invalid(field, "the parameter count overflows 64 bits");
  }
  return start;
}

const char* KindName(v1::ModelConfig::Kind kind) {
  switch (kind) {
    case v1::ModelConfig::SOFTMAX:
      return "SOFTMAX";
    case v1::ModelConfig::MLP:
      return "MLP";
    case v1::ModelConfig::FLAT:
      return "FLAT";
    default:
      return "not CNN";
  }
}

// A conv field set on a model that has no conv stages is a mistake the user
// should hear about, not a silently ignored line.
absl::Status CheckNoCnnFields(const v1::ModelConfig& config) {
  const std::string why =
      absl::StrCat("only a CNN has it (kind is ", KindName(config.kind()), ")");
  if (config.conv_channels_size() != 0) {
    return Invalid("model.conv_channels", why);
  }
  if (config.kernel_size() != 0) return Invalid("model.kernel_size", why);
  if (config.image_height() != 0) return Invalid("model.image_height", why);
  if (config.image_width() != 0) return Invalid("model.image_width", why);
  if (config.image_channels() != 0) {
    return Invalid("model.image_channels", why);
  }
  return absl::OkStatus();
}

// Fills spec->convs and spec->input_dim for a CNN; `offset` is the layout so
// far (0). Returns the flattened size of the last stage's output.
absl::StatusOr<size_t> MakeConvStages(const v1::ModelConfig& config,
                                      ModelSpec* spec, size_t* offset) {
  if (config.hidden_size() != 0) {
    return Invalid("model.hidden",
                   absl::StrCat("must be empty for a CNN model (got ",
                                config.hidden_size(), " widths)"));
  }
  const size_t height = config.image_height() == 0 ? kDefaultImageHeight
                                                   : config.image_height();
  const size_t width =
      config.image_width() == 0 ? kDefaultImageWidth : config.image_width();
  const size_t channels = config.image_channels() == 0
                              ? kDefaultImageChannels
                              : config.image_channels();
  ASSIGN_OR_RETURN(const size_t plane,
                   Multiply(height, width, "model.image_height"));
  ASSIGN_OR_RETURN(const size_t image_size,
                   Multiply(plane, channels, "model.image_channels"));
  if (config.input_dim() == 0) {
    spec->input_dim = image_size;
  } else if (spec->input_dim != image_size) {
    return Invalid("model.input_dim",
                   absl::StrCat(spec->input_dim,
                                " != image_height * image_width * "
                                "image_channels = ",
                                image_size, " (", height, " * ", width, " * ",
                                channels, ")"));
  }
  const size_t kernel =
      config.kernel_size() == 0 ? kDefaultKernelSize : config.kernel_size();
  if (kernel % 2 == 0) {
    return Invalid("model.kernel_size",
                   absl::StrCat("must be odd for 'same' padding (got ", kernel,
                                ")"));
  }
  std::vector<size_t> out_channels;
  if (config.conv_channels_size() == 0) {
    out_channels.assign(std::begin(kDefaultConvChannels),
                        std::end(kDefaultConvChannels));
  } else {
    out_channels.assign(config.conv_channels().begin(),
                        config.conv_channels().end());
  }

  ConvLayerSpec stage;
  stage.in_channels = channels;
  stage.height = height;
  stage.width = width;
  stage.kernel = kernel;
  for (size_t c = 0; c < out_channels.size(); ++c) {
    const std::string field = absl::StrCat("model.conv_channels[", c, "]");
    if (out_channels[c] == 0) return Invalid(field, "must be > 0 (got 0)");
    if (stage.height < 2 || stage.width < 2) {
      return Invalid(
          "model.conv_channels",
          absl::StrCat(out_channels.size(),
                       " stages are too many for a ", height, " x ", width,
                       " image: stage ", c, " would pool a ", stage.height,
                       " x ", stage.width,
                       " input to nothing (each stage halves both sides)"));
    }
    stage.out_channels = out_channels[c];
    stage.pooled_height = stage.height / 2;
    stage.pooled_width = stage.width / 2;
    ASSIGN_OR_RETURN(size_t weights,
                     Multiply(stage.out_channels, stage.in_channels, field));
    ASSIGN_OR_RETURN(weights, Multiply(weights, kernel * kernel, field));
    ASSIGN_OR_RETURN(stage.weight_offset, Reserve(offset, weights, field));
    ASSIGN_OR_RETURN(stage.bias_offset,
                     Reserve(offset, stage.out_channels, field));
    spec->convs.push_back(stage);

    stage.in_channels = stage.out_channels;
    stage.height = stage.pooled_height;
    stage.width = stage.pooled_width;
  }
  return spec->convs.back().output_size();
}

}  // namespace

absl::StatusOr<ModelSpec> MakeModelSpec(const v1::ModelConfig& config) {
  ModelSpec spec;
  spec.input_dim = config.input_dim() == 0 ? 784 : config.input_dim();
  spec.num_classes = config.num_classes() == 0 ? 10 : config.num_classes();
  if (config.kind() != v1::ModelConfig::FLAT && config.num_params() != 0) {
    return Invalid("model.num_params",
                   absl::StrCat("only a FLAT model has it (kind is ",
                                v1::ModelConfig::Kind_Name(config.kind()), ")"));
  }
  size_t offset = 0;
  std::vector<size_t> widths;
  switch (config.kind()) {
    case v1::ModelConfig::FLAT:
      if (config.hidden_size() != 0) {
        return Invalid("model.hidden", "a FLAT model has no layers cserps knows");
      }
      RETURN_IF_ERROR(CheckNoCnnFields(config));
      if (config.num_params() < 1) return Invalid("model.num_params", "must be >= 1 (got 0)");
      spec.num_params = config.num_params();
      return spec;
    case v1::ModelConfig::SOFTMAX:
      if (config.hidden_size() != 0) {
        return absl::InvalidArgumentError(
            "model.hidden: a SOFTMAX model has no hidden layers");
      }
      RETURN_IF_ERROR(CheckNoCnnFields(config));
      widths = {spec.input_dim};
      break;
    case v1::ModelConfig::MLP:
      if (config.hidden_size() == 0) {
        return absl::InvalidArgumentError(
            "model.hidden: an MLP needs at least one hidden width");
      }
      RETURN_IF_ERROR(CheckNoCnnFields(config));
      widths = {spec.input_dim};
      for (int i = 0; i < config.hidden_size(); ++i) {
        if (config.hidden(i) == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.hidden[", i, "]: width must be > 0"));
        }
        widths.push_back(config.hidden(i));
      }
      break;
    case v1::ModelConfig::CNN: {
      ASSIGN_OR_RETURN(const size_t flattened,
                       MakeConvStages(config, &spec, &offset));
      widths = {flattened};
      break;
    }
    default:
      return absl::InvalidArgumentError(
          "model.kind: must be SOFTMAX, MLP, CNN or FLAT");
  }
  widths.push_back(spec.num_classes);
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::string field =
        l + 2 == widths.size() ? std::string("model.num_classes")
                               : absl::StrCat("model.hidden[", l, "]");
    LinearLayerSpec layer;
    layer.in = widths[l];
    layer.out = widths[l + 1];
    ASSIGN_OR_RETURN(const size_t weights, Multiply(layer.in, layer.out, field));
    ASSIGN_OR_RETURN(layer.weight_offset, Reserve(&offset, weights, field));
    ASSIGN_OR_RETURN(layer.bias_offset, Reserve(&offset, layer.out, field));
    spec.layers.push_back(layer);
  }
  spec.num_params = offset;
  return spec;
}

}  // namespace cserps
