#include "common/algorithm_catalog.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cserps {

const std::vector<AlgorithmInfo>& KnownAlgorithms() {
  // Leaked on purpose: no destructor runs at exit while another thread may
  // still read it.
  static const auto* const kAlgorithms = new std::vector<AlgorithmInfo>{
      {"ssgd",
       "synchronous SGD: every step the servers average the full gradient of "
       "all workers (streams: GRAD; overall compression ratio 1)"},
  };
  return *kAlgorithms;
}

absl::StatusOr<AlgorithmInfo> FindAlgorithm(absl::string_view name) {
  std::string known;
  for (const AlgorithmInfo& info : KnownAlgorithms()) {
    if (info.name == name) return info;
    absl::StrAppend(&known, known.empty() ? "" : ", ", info.name);
  }
  return absl::NotFoundError(absl::StrCat(
      "algorithm.name: unknown algorithm \"", name, "\"; known: ", known));
}

}  // namespace cserps
