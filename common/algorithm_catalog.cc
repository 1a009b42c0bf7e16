#include "common/algorithm_catalog.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cserps {
namespace {

// Stream values of cserps.v1.Stream (parameter_server.proto), which this
// file does not include to keep common/ free of the service definitions.
constexpr int kGrad = 1;
constexpr int kModel = 2;

enum Param { kPeriod, kRatioC1, kRatioC2, kRatio };

struct Entry {
  AlgorithmInfo info;
  std::vector<Param> params;  // the AlgorithmConfig fields it reads
};

const std::vector<Entry>& Entries() {
  // Leaked on purpose: no destructor runs at exit while another thread may
  // still read it.
  static const auto* const kEntries = new std::vector<Entry>{
      {{"async-sgd",
        "asynchronous SGD: no barrier; every step each worker pushes its "
        "gradient, the servers apply it at once with server-side momentum and "
        "answer with the model; algorithm.staleness bounds how far a worker "
        "runs ahead of the slowest (R_C = 1)"},
       {}},
      {{"cocod-sgd",
        "CoCoD-SGD: the model average of a snapshot runs while the next k "
        "local steps compute, then x = avg + (x - snapshot) (R_C = k)"},
       {kPeriod}},
      {{"csea",
        "CSEA: every step the model is averaged on R_C1-sparse blocks "
        "(R_C = R_C1)"},
       {kRatioC1}},
      {{"cser",
        "CSER: local steps with error reset; per step the model (MODEL_BLOCKS) "
        "or the update (GRADIENT_BLOCKS) is averaged on R_C2-sparse blocks, "
        "every H steps the model on R_C1-sparse blocks"},
       {kPeriod, kRatioC1, kRatioC2}},
      {{"cser-pl",
        "CSER-PL: local steps; every H steps the model is averaged on "
        "R_C1-sparse blocks (R_C = H*R_C1)"},
       {kPeriod, kRatioC1}},
      {{"ef-sgd",
        "EF-SGD: one shared model; the update plus the local error is averaged "
        "on R-sparse blocks, the rest kept as error (R_C = R)"},
       {kRatio}},
      {{"gtopk-ssgd",
        "gTop-k S-SGD: every step each worker pushes its local top-k of "
        "update plus residual; the servers keep the global top-k of the sum "
        "(R_C ~ 1/density)"},
       {}},
      {{"local-sgd",
        "local SGD: local steps; every H steps the full model is averaged "
        "(R_C = H)"},
       {kPeriod}},
      {{"m-cser", "M-CSER: CSER with Nesterov momentum kept local"},
       {kPeriod, kRatioC1, kRatioC2}},
      {{"pipe-sgd",
        "Pipe-SGD: the gradient average of step t-1 runs while step t "
        "computes (R_C = 1)"},
       {}},
      {{"qsparse-local-sgd",
        "QSparse-local-SGD: H local steps, then the drift plus memory is "
        "averaged on R-sparse blocks (R_C = H*R)"},
       {kPeriod, kRatio}},
      {{"ssgd",
        "synchronous SGD: every step the servers average the full update of "
        "all workers (streams: GRAD; overall compression ratio 1)"},
       {}},
      {{"topk-ssgd",
        "Top-k S-SGD: every step each worker pushes its local top-k of "
        "update plus residual; the servers return the sum on the union "
        "(R_C ~ 1/density)"},
       {}},
  };
  return *kEntries;
}

const Entry* FindEntry(absl::string_view name) {
  for (const Entry& e : Entries()) {
    if (e.info.name == name) return &e;
  }
  return nullptr;
}

const char* ParamName(Param p) {
  switch (p) {
    case kPeriod:
      return "period";
    case kRatioC1:
      return "ratio_c1";
    case kRatioC2:
      return "ratio_c2";
    case kRatio:
      return "ratio";
  }
  return "?";
}

uint32_t ParamValue(const v1::AlgorithmConfig& a, Param p) {
  switch (p) {
    case kPeriod:
      return a.period();
    case kRatioC1:
      return a.ratio_c1();
    case kRatioC2:
      return a.ratio_c2();
    case kRatio:
      return a.ratio();
  }
  return 0;
}

bool IsCser(absl::string_view name) { return name == "cser" || name == "m-cser"; }

bool ModelBlocks(const v1::AlgorithmConfig& a) {
  return a.cser_variant() != v1::AlgorithmConfig::GRADIENT_BLOCKS;
}

// The (stream, ratio) pairs the algorithm's steps use.
std::vector<std::pair<int, uint32_t>> RoundRatios(const v1::AlgorithmConfig& a) {
  const std::string& n = a.name();
  if (n == "ssgd") return {{kGrad, 1}};
  if (n == "ef-sgd" || n == "qsparse-local-sgd") return {{kGrad, a.ratio()}};
  if (n == "local-sgd" || n == "cocod-sgd") return {{kModel, 1}};
  if (n == "pipe-sgd") return {{kGrad, 1}};
  if (n == "cser-pl" || n == "csea") return {{kModel, a.ratio_c1()}};
  if (IsCser(n)) {
    if (ModelBlocks(a)) return {{kModel, a.ratio_c1()}, {kModel, a.ratio_c2()}};
    return {{kGrad, a.ratio_c2()}, {kModel, a.ratio_c1()}};
  }
  return {};
}

}  // namespace

const std::vector<AlgorithmInfo>& KnownAlgorithms() {
  static const auto* const kInfos = [] {
    auto* infos = new std::vector<AlgorithmInfo>();
    for (const Entry& e : Entries()) infos->push_back(e.info);
    return infos;
  }();
  return *kInfos;
}

absl::StatusOr<AlgorithmInfo> FindAlgorithm(absl::string_view name) {
  if (const Entry* e = FindEntry(name)) return e->info;
  std::vector<std::string> known;
  for (const Entry& e : Entries()) known.push_back(e.info.name);
  return absl::NotFoundError(absl::StrCat("algorithm.name: unknown algorithm \"",
                                          name, "\"; known: ",
                                          absl::StrJoin(known, ", ")));
}

absl::Status ValidateAlgorithm(const v1::AlgorithmConfig& algorithm,
                               const v1::OptimizerConfig& optimizer) {
  const Entry* entry = FindEntry(algorithm.name());
  if (entry == nullptr) return FindAlgorithm(algorithm.name()).status();
  for (Param p : {kPeriod, kRatioC1, kRatioC2, kRatio}) {
    const bool used = std::find(entry->params.begin(), entry->params.end(), p) !=
                      entry->params.end();
    const uint32_t value = ParamValue(algorithm, p);
    if (used && value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm.", ParamName(p), ": ", algorithm.name(), " needs it >= 1 (got 0)"));
    }
    if (!used && value != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm.", ParamName(p), ": ", algorithm.name(),
          " does not use it (got ", value, "); leave it unset"));
    }
  }
  if (algorithm.cser_variant() != v1::AlgorithmConfig::VARIANT_UNSPECIFIED &&
      !IsCser(algorithm.name())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.cser_variant: only cser and m-cser have variants, not ",
        algorithm.name()));
  }
  if (!v1::AlgorithmConfig::CserVariant_IsValid(algorithm.cser_variant())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.cser_variant: unknown value ", algorithm.cser_variant()));
  }
  if (algorithm.period_warmup_epochs() != 0 && algorithm.name() != "cocod-sgd") {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.period_warmup_epochs: only cocod-sgd uses it, not ",
        algorithm.name()));
  }
  if (algorithm.staleness() != 0 && algorithm.name() != "async-sgd") {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.staleness: only async-sgd uses it, not ", algorithm.name(),
        " (got ", algorithm.staleness(), "); leave it unset"));
  }
  if (IsSparseTopk(algorithm.name())) {
    const float density = algorithm.density();
    if (!std::isfinite(density) || !(density > 0.0f) || density > 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm.density: ", algorithm.name(),
          " needs it in (0, 1] (got ", density, ")"));
    }
  } else if (algorithm.density() != 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.density: only gtopk-ssgd and topk-ssgd use it, not ",
        algorithm.name(), " (got ", algorithm.density(), "); leave it unset"));
  }
  if (algorithm.name() == "m-cser" &&
      optimizer.momentum_kind() != v1::OptimizerConfig::NESTEROV) {
    return absl::InvalidArgumentError(
        "optimizer.momentum_kind: m-cser is CSER with Nesterov momentum; set "
        "NESTEROV (or use cser)");
  }
  return absl::OkStatus();
}

double OverallRatio(const v1::AlgorithmConfig& a) {
  const std::string& n = a.name();
  const double h = a.period(), r = a.ratio(), r1 = a.ratio_c1(), r2 = a.ratio_c2();
  if (n == "ef-sgd") return r;
  // d floats against k values (each also sends a 4-byte index; see
  // docs/algorithms.md).
  if (IsSparseTopk(n)) return 1.0 / a.density();
  // cocod-sgd: k during the main phase (period_warmup_epochs with k = 1 aside).
  if (n == "local-sgd" || n == "cocod-sgd") return h;
  if (n == "qsparse-local-sgd") return h * r;
  if (n == "cser-pl") return h * r1;
  if (n == "csea") return r1;
  if (IsCser(n)) {
    // GRADIENT_BLOCKS sends an R_C2 round every step and an R_C1 round every
    // H steps (the paper's formula); MODEL_BLOCKS sends R_C1 instead of R_C2
    // on the sync step.
    if (!ModelBlocks(a)) return 1.0 / (1.0 / r2 + 1.0 / (r1 * h));
    return h / ((h - 1) / r2 + 1.0 / r1);
  }
  return 1.0;
}

std::string DescribeAlgorithm(const v1::AlgorithmConfig& a) {
  const Entry* entry = FindEntry(a.name());
  if (entry == nullptr) return a.name();
  std::string text = a.name();
  if (IsCser(a.name())) {
    absl::StrAppend(&text, ModelBlocks(a) ? " (MODEL_BLOCKS)" : " (GRADIENT_BLOCKS)");
  }
  std::vector<std::string> params;
  for (Param p : entry->params) {
    static constexpr const char* kShown[] = {"H", "R_C1", "R_C2", "R"};
    params.push_back(absl::StrCat(kShown[p], "=", ParamValue(a, p)));
  }
  if (a.name() == "async-sgd") params.push_back(absl::StrCat("s=", a.staleness()));
  if (!params.empty()) absl::StrAppend(&text, ": ", absl::StrJoin(params, ", "));
  absl::StrAppend(&text, absl::StrFormat(" -> overall R_C = %.4g", OverallRatio(a)));
  return text;
}

absl::Status CheckRoundRatio(const v1::AlgorithmConfig& algorithm, int stream,
                             uint32_t ratio) {
  if (stream == kModel && ratio == 1) return absl::OkStatus();
  std::vector<std::string> used;
  for (const auto& [s, r] : RoundRatios(algorithm)) {
    if (s == stream && r == ratio) return absl::OkStatus();
    used.push_back(absl::StrCat(s == kGrad ? "GRAD" : "MODEL", " at ratio ", r));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "ratio ", ratio, " on stream ", stream == kGrad ? "GRAD" : "MODEL",
      " is not the job's: algorithm ", algorithm.name(), " uses ",
      used.empty() ? (IsSparseTopk(algorithm.name())
                          ? std::string("no averaging rounds but the sparse exchange")
                          : std::string("no averaging rounds but its own service"))
                   : absl::StrJoin(used, ", "),
      " (and MODEL at ratio 1 to finish)"));
}

bool IsSparseTopk(absl::string_view name) {
  return name == "gtopk-ssgd" || name == "topk-ssgd";
}

uint64_t SparseK(const v1::AlgorithmConfig& algorithm, uint64_t num_params) {
  if (num_params == 0) return 0;
  const double k =
      std::round(static_cast<double>(algorithm.density()) * static_cast<double>(num_params));
  return std::clamp<uint64_t>(static_cast<uint64_t>(std::max(k, 1.0)), 1, num_params);
}

uint64_t ShardSparseK(uint64_t k, uint64_t shard_size, uint64_t num_params) {
  if (shard_size == 0 || num_params == 0) return 0;
  // round(k * size / d), half up, exactly: 128 bits hold 2 * k * size.
  using u128 = unsigned __int128;
  const u128 num = 2 * static_cast<u128>(k) * shard_size + num_params;
  const uint64_t rounded = static_cast<uint64_t>(num / (2 * static_cast<u128>(num_params)));
  return std::clamp<uint64_t>(rounded, 1, shard_size);
}

}  // namespace cserps
