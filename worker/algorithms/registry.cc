#include "worker/algorithms/registry.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

std::unique_ptr<Algorithm> Make(AlgorithmId id, const AlgorithmContext& context) {
  switch (id) {
    case AlgorithmId::kAsyncSgd:
      return MakeAsyncSgd(context);
    case AlgorithmId::kCocodSgd:
      return MakeCocodSgd(context);
    case AlgorithmId::kCsea:
      return MakeCsea(context);
    case AlgorithmId::kCser:
    case AlgorithmId::kMCser:
      return MakeCser(context);
    case AlgorithmId::kCserPl:
      return MakeCserPl(context);
    case AlgorithmId::kEfSgd:
      return MakeEfSgd(context);
    case AlgorithmId::kGtopkSsgd:
      return MakeGtopkSsgd(context);
    case AlgorithmId::kLocalSgd:
      return MakeLocalSgd(context);
    case AlgorithmId::kPipeSgd:
      return MakePipeSgd(context);
    case AlgorithmId::kQsparseLocalSgd:
      return MakeQsparseLocalSgd(context);
    case AlgorithmId::kSsgd:
      return MakeSsgd(context);
    case AlgorithmId::kTopkSsgd:
      return MakeTopkSsgd(context);
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeAlgorithm(const AlgorithmContext& context) {
  ASSIGN_OR_RETURN(const AlgorithmInfo info, FindAlgorithm(context.config->algorithm().name()));
  if (context.group != nullptr && !info.runs_on_node()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size: algorithm.name \"", info.name,
        "\" has no form for nodes of several local ranks (its exchange has no "
        "intra-node form)"));
  }
  const uint64_t d = context.comm->layout().num_params();
  if (info.exchange == Exchange::kSparse && d > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.name: ", info.name,
                                                   " sends uint32 indices, but the model has ",
                                                   d, " floats (at most 2^32)"));
  }
  std::unique_ptr<Algorithm> algorithm = Make(info.id, context);
  CSERPS_CHECK(algorithm != nullptr);
  RETURN_IF_ERROR(algorithm->Init());
  return algorithm;
}

}  // namespace cserps
