#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/algorithms/algorithm.h"
#include "worker/algorithms/factories.h"

namespace cserps {

absl::Status AlgorithmRegistry::Register(const std::string& name,
                                         AlgorithmFactory factory) {
  if (!factories_.emplace(name, std::move(factory)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("algorithm \"", name, "\" is already registered"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Algorithm>> AlgorithmRegistry::Create(
    const std::string& name, const AlgorithmContext& context) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::vector<std::string> known;
    for (const auto& [known_name, factory] : factories_) known.push_back(known_name);
    return absl::NotFoundError(absl::StrCat("algorithm.name: unknown algorithm \"",
                                            name, "\"; known: ",
                                            absl::StrJoin(known, ", ")));
  }
  return it->second(context);
}

absl::Status Algorithm::Finish(uint64_t step, absl::Span<float> params) {
  return context_.comm->AverageBlocks(v1::MODEL, step, /*ratio=*/1, params,
                                      context_.weight, /*lr=*/0, params);
}

const AlgorithmRegistry& DefaultAlgorithms() {
  static const AlgorithmRegistry* const registry = [] {
    auto* r = new AlgorithmRegistry();
    CSERPS_CHECK(r->Register("ssgd", MakeSsgd).ok());
    CSERPS_CHECK(r->Register("async-sgd", MakeAsyncSgd).ok());
    CSERPS_CHECK(r->Register("ef-sgd", MakeEfSgd).ok());
    CSERPS_CHECK(r->Register("local-sgd", MakeLocalSgd).ok());
    CSERPS_CHECK(r->Register("qsparse-local-sgd", MakeQsparseLocalSgd).ok());
    CSERPS_CHECK(r->Register("cser", MakeCser).ok());
    CSERPS_CHECK(r->Register("m-cser", MakeCser).ok());
    CSERPS_CHECK(r->Register("cser-pl", MakeCserPl).ok());
    CSERPS_CHECK(r->Register("csea", MakeCsea).ok());
    CSERPS_CHECK(r->Register("gtopk-ssgd", MakeGtopkSsgd).ok());
    CSERPS_CHECK(r->Register("topk-ssgd", MakeTopkSsgd).ok());
    CSERPS_CHECK(r->Register("cocod-sgd", MakeCocodSgd).ok());
    CSERPS_CHECK(r->Register("pipe-sgd", MakePipeSgd).ok());
    return r;
  }();
  return *registry;
}

}  // namespace cserps
