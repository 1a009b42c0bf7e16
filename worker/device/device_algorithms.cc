#include "worker/device/device_algorithms.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grbs.h"
#include "common/status.h"
#include "worker/device/device_algorithm_base.h"

namespace cserps {

DeviceAlgorithmBase::DeviceAlgorithmBase(const DeviceAlgorithmContext& context)
    : context_(context), rule_(MakeDirectionRule(context.config->optimizer())) {}

absl::Status DeviceAlgorithmBase::Init() {
  // Here rather than at the first average: on a node, a local rank that
  // cannot make it would leave its peers waiting in that average.
  ASSIGN_OR_RETURN(staging_, ops().MakeStaging(context_.group));
  if (rule_.kind == v1::OptimizerConfig::NONE) return absl::OkStatus();
  return Allocate(&momentum_);
}

absl::Status DeviceAlgorithmBase::Finish(uint64_t step, float* x) {
  return Average(v1::MODEL, step, /*ratio=*/1, /*lr=*/0, x, ScatterKind::kAssign, 0, x);
}

absl::Status DeviceAlgorithmBase::Allocate(DeviceVector* buffer) {
  ASSIGN_OR_RETURN(*buffer, ops().Allocate());
  return absl::OkStatus();
}

absl::Status DeviceAlgorithmBase::Average(v1::Stream stream, uint64_t step,
                                          uint32_t ratio, float lr, const float* values,
                                          ScatterKind kind, float alpha, float* target) {
  const BlockLayout& layout = context_.client->layout();
  const uint64_t seed = context_.config->seed();
  auto begin_round = [&](float weight) {
    return context_.client->BeginShardedAverage(stream, step, ratio, weight, lr);
  };
  if (context_.group != nullptr) {
    return NodeStagedAverage(layout, seed, stream, step, ratio, *context_.group,
                             context_.weight, begin_round, *staging_, values, kind, alpha,
                             target);
  }
  return StagedAverage(layout, seed, stream, step, ratio, *begin_round(context_.weight),
                       *staging_, values, kind, alpha, target);
}

std::vector<uint64_t> DeviceAlgorithmBase::Blocks(v1::Stream stream, uint64_t step,
                                                  uint32_t ratio) const {
  return SelectBlocks(context_.config->seed(), stream, step, ratio,
                      context_.client->layout().num_blocks());
}

namespace {

using Factory = std::unique_ptr<DeviceAlgorithmBase> (*)(const DeviceAlgorithmContext&);

const std::map<std::string, Factory>& Factories() {
  static const auto* const factories = new std::map<std::string, Factory>{
      {"ssgd", MakeDeviceSsgd},
      {"async-sgd", MakeDeviceAsyncSgd},
      {"cser", MakeDeviceCser},
      {"m-cser", MakeDeviceCser},
      {"cser-pl",
       [](const DeviceAlgorithmContext& c) {
         const v1::AlgorithmConfig& a = c.config->algorithm();
         return MakeDevicePeriodicAverage(c, a.period(), a.ratio_c1());
       }},
      {"csea",
       [](const DeviceAlgorithmContext& c) {
         return MakeDevicePeriodicAverage(c, /*period=*/1, c.config->algorithm().ratio_c1());
       }},
      {"local-sgd",
       [](const DeviceAlgorithmContext& c) {
         return MakeDevicePeriodicAverage(c, c.config->algorithm().period(), /*ratio=*/1);
       }},
      {"ef-sgd", MakeDeviceEfSgd},
      {"qsparse-local-sgd", MakeDeviceQsparseLocalSgd},
      {"topk-ssgd", MakeDeviceSparseTopk},
      {"gtopk-ssgd", MakeDeviceSparseTopk},
  };
  return *factories;
}

// The algorithms whose exchanges (sparse, async) have no node path.
bool IsNodeless(const std::string& name) {
  return name == "topk-ssgd" || name == "gtopk-ssgd" || name == "async-sgd";
}

}  // namespace

bool HasDeviceAlgorithm(const v1::AlgorithmConfig& config, bool on_node) {
  return Factories().count(config.name()) > 0 && !(on_node && IsNodeless(config.name()));
}

absl::StatusOr<std::unique_ptr<DeviceAlgorithm>> MakeDeviceAlgorithm(
    const DeviceAlgorithmContext& context) {
  const std::string& name = context.config->algorithm().name();
  const auto it = Factories().find(name);
  if (it != Factories().end() && context.group != nullptr && IsNodeless(name)) {
    return absl::UnimplementedError(absl::StrCat(
        "algorithm.name: \"", name,
        "\" has no device implementation for nodes of several local ranks "
        "(cluster.local_size > 1)"));
  }
  if (it == Factories().end()) {
    return absl::UnimplementedError(absl::StrCat(
        "algorithm.name: \"", name,
        "\" has no device implementation (its averages stay in flight across steps)"));
  }
  const uint64_t d = context.client->layout().num_params();
  if ((name == "topk-ssgd" || name == "gtopk-ssgd") && d > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.name: ", name, " sends uint32 indices, but the model has ", d,
        " floats (at most 2^32)"));
  }
  std::unique_ptr<DeviceAlgorithmBase> algorithm = it->second(context);
  RETURN_IF_ERROR(algorithm->Init());
  return std::unique_ptr<DeviceAlgorithm>(std::move(algorithm));
}

}  // namespace cserps
