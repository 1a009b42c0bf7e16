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

// The integer AlgorithmConfig fields an entry reads, as bits.
enum Param : unsigned { kPeriod = 1, kRatioC1 = 2, kRatioC2 = 4, kRatio = 8 };
constexpr Param kParams[] = {kPeriod, kRatioC1, kRatioC2, kRatio};

using Rounds = std::vector<std::pair<int, uint32_t>>;

bool ModelBlocks(const v1::AlgorithmConfig& a) {
  return a.cser_variant() != v1::AlgorithmConfig::GRADIENT_BLOCKS;
}

// The R_C formulas (ALGORITHMS.md).
double NoCompression(const v1::AlgorithmConfig&) { return 1.0; }
double Period(const v1::AlgorithmConfig& a) { return a.period(); }
double Ratio(const v1::AlgorithmConfig& a) { return a.ratio(); }
double RatioC1(const v1::AlgorithmConfig& a) { return a.ratio_c1(); }
double PeriodTimesRatio(const v1::AlgorithmConfig& a) {
  return static_cast<double>(a.period()) * a.ratio();
}
double PeriodTimesRatioC1(const v1::AlgorithmConfig& a) {
  return static_cast<double>(a.period()) * a.ratio_c1();
}
// d floats against k values (each also sends a 4-byte index; see
// docs/algorithms.md).
double InverseDensity(const v1::AlgorithmConfig& a) { return 1.0 / a.density(); }
// GRADIENT_BLOCKS sends an R_C2 round every step and an R_C1 round every H
// steps (the paper's formula); MODEL_BLOCKS sends R_C1 instead of R_C2 on
// the sync step.
double CserRatio(const v1::AlgorithmConfig& a) {
  const double h = a.period(), r1 = a.ratio_c1(), r2 = a.ratio_c2();
  if (!ModelBlocks(a)) return 1.0 / (1.0 / r2 + 1.0 / (r1 * h));
  return h / ((h - 1) / r2 + 1.0 / r1);
}

// The (stream, ratio) pairs of the rounds an algorithm's steps use.
Rounds NoRounds(const v1::AlgorithmConfig&) { return {}; }
Rounds FullGradient(const v1::AlgorithmConfig&) { return {{kGrad, 1}}; }
Rounds FullModel(const v1::AlgorithmConfig&) { return {{kModel, 1}}; }
Rounds GradientAtRatio(const v1::AlgorithmConfig& a) { return {{kGrad, a.ratio()}}; }
Rounds ModelAtRatioC1(const v1::AlgorithmConfig& a) { return {{kModel, a.ratio_c1()}}; }
Rounds CserRounds(const v1::AlgorithmConfig& a) {
  if (ModelBlocks(a)) return {{kModel, a.ratio_c1()}, {kModel, a.ratio_c2()}};
  return {{kGrad, a.ratio_c2()}, {kModel, a.ratio_c1()}};
}

// What an entry reads besides the integer parameters.
enum Extra : unsigned {
  kNone = 0,
  kCserVariant = 1,         // algorithm.cser_variant
  kPeriodWarmup = 2,        // algorithm.period_warmup_epochs
  kStaleness = 4,           // algorithm.staleness
  kDensity = 8,             // algorithm.density
};

// One algorithm: its AlgorithmInfo, its R_C formula, and what it reads and
// sends.
struct Entry {
  AlgorithmId id;
  const char* name;
  double (*overall_ratio)(const v1::AlgorithmConfig&);
  unsigned params;  // Param bits
  unsigned extras;  // Extra bits
  Rounds (*rounds)(const v1::AlgorithmConfig&);
  Exchange exchange = Exchange::kAverages;
  bool needs_nesterov = false;
};

// docs/algorithms.md describes each.
constexpr Entry kEntries[] = {
    {AlgorithmId::kAsyncSgd, "async-sgd", NoCompression, 0, kStaleness, NoRounds,
     Exchange::kAsync},
    // R_C = k of the main phase (period_warmup_epochs with k = 1 aside).
    {AlgorithmId::kCocodSgd, "cocod-sgd", Period, kPeriod, kPeriodWarmup, FullModel},
    {AlgorithmId::kCsea, "csea", RatioC1, kRatioC1, kNone, ModelAtRatioC1},
    {AlgorithmId::kCser, "cser", CserRatio, kPeriod | kRatioC1 | kRatioC2, kCserVariant,
     CserRounds},
    {AlgorithmId::kCserPl, "cser-pl", PeriodTimesRatioC1, kPeriod | kRatioC1, kNone,
     ModelAtRatioC1},
    {AlgorithmId::kEfSgd, "ef-sgd", Ratio, kRatio, kNone, GradientAtRatio},
    {AlgorithmId::kGtopkSsgd, "gtopk-ssgd", InverseDensity, 0, kDensity, NoRounds,
     Exchange::kSparse},
    {AlgorithmId::kLocalSgd, "local-sgd", Period, kPeriod, kNone, FullModel},
    {AlgorithmId::kMCser, "m-cser", CserRatio, kPeriod | kRatioC1 | kRatioC2, kCserVariant,
     CserRounds, Exchange::kAverages, /*needs_nesterov=*/true},
    {AlgorithmId::kPipeSgd, "pipe-sgd", NoCompression, 0, kNone, FullGradient},
    {AlgorithmId::kQsparseLocalSgd, "qsparse-local-sgd", PeriodTimesRatio, kPeriod | kRatio,
     kNone, GradientAtRatio},
    {AlgorithmId::kSsgd, "ssgd", NoCompression, 0, kNone, FullGradient},
    {AlgorithmId::kTopkSsgd, "topk-ssgd", InverseDensity, 0, kDensity, NoRounds,
     Exchange::kSparse},
};

AlgorithmInfo Info(const Entry& e) {
  return {e.id, e.name, e.exchange, e.needs_nesterov};
}

const Entry* FindEntry(absl::string_view name) {
  for (const Entry& e : kEntries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

// "a and b": the names of the entries that read `extra`.
std::string ReadersOf(Extra extra) {
  std::vector<std::string> names;
  for (const Entry& e : kEntries) {
    if (e.extras & extra) names.push_back(e.name);
  }
  return absl::StrJoin(names, " and ");
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

// The parameter's name in the listings (DescribeAlgorithm).
const char* ShownName(Param p) {
  switch (p) {
    case kPeriod:
      return "H";
    case kRatioC1:
      return "R_C1";
    case kRatioC2:
      return "R_C2";
    case kRatio:
      return "R";
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

}  // namespace

const std::vector<AlgorithmInfo>& KnownAlgorithms() {
  static const auto* const kInfos = [] {
    auto* infos = new std::vector<AlgorithmInfo>();
    for (const Entry& e : kEntries) infos->push_back(Info(e));
    return infos;
  }();
  return *kInfos;
}

absl::StatusOr<AlgorithmInfo> FindAlgorithm(absl::string_view name) {
  if (const Entry* e = FindEntry(name)) return Info(*e);
  std::vector<std::string> known;
  for (const Entry& e : kEntries) known.push_back(e.name);
  return absl::NotFoundError(absl::StrCat("algorithm.name: unknown algorithm \"",
                                          name, "\"; known: ",
                                          absl::StrJoin(known, ", ")));
}

absl::Status ValidateAlgorithm(const v1::AlgorithmConfig& algorithm,
                               const v1::OptimizerConfig& optimizer) {
  const Entry* entry = FindEntry(algorithm.name());
  if (entry == nullptr) return FindAlgorithm(algorithm.name()).status();
  for (Param p : kParams) {
    const bool used = (entry->params & p) != 0;
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
  const unsigned extras = entry->extras;
  if (algorithm.cser_variant() != v1::AlgorithmConfig::VARIANT_UNSPECIFIED &&
      !(extras & kCserVariant)) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.cser_variant: only ",
                                                   ReadersOf(kCserVariant),
                                                   " have variants, not ", algorithm.name()));
  }
  if (!v1::AlgorithmConfig::CserVariant_IsValid(algorithm.cser_variant())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.cser_variant: unknown value ", algorithm.cser_variant()));
  }
  if (algorithm.period_warmup_epochs() != 0 && !(extras & kPeriodWarmup)) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.period_warmup_epochs: only ",
                                                   ReadersOf(kPeriodWarmup),
                                                   " uses it, not ", algorithm.name()));
  }
  if (algorithm.staleness() != 0 && !(extras & kStaleness)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.staleness: only ", ReadersOf(kStaleness), " uses it, not ",
        algorithm.name(), " (got ", algorithm.staleness(), "); leave it unset"));
  }
  if (extras & kDensity) {
    const float density = algorithm.density();
    if (!std::isfinite(density) || !(density > 0.0f) || density > 1.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm.density: ", algorithm.name(),
          " needs it in (0, 1] (got ", density, ")"));
    }
  } else if (algorithm.density() != 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm.density: only ", ReadersOf(kDensity), " use it, not ",
        algorithm.name(), " (got ", algorithm.density(), "); leave it unset"));
  }
  if (entry->needs_nesterov &&
      optimizer.momentum_kind() != v1::OptimizerConfig::NESTEROV) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.momentum_kind: ", algorithm.name(),
        " is CSER with Nesterov momentum; set NESTEROV (or use cser)"));
  }
  return absl::OkStatus();
}

double OverallRatio(const v1::AlgorithmConfig& a) {
  const Entry* entry = FindEntry(a.name());
  return entry == nullptr ? 1.0 : entry->overall_ratio(a);
}

std::string DescribeAlgorithm(const v1::AlgorithmConfig& a) {
  const Entry* entry = FindEntry(a.name());
  if (entry == nullptr) return a.name();
  std::string text = a.name();
  if (entry->extras & kCserVariant) {
    absl::StrAppend(&text, ModelBlocks(a) ? " (MODEL_BLOCKS)" : " (GRADIENT_BLOCKS)");
  }
  std::vector<std::string> params;
  for (Param p : kParams) {
    if (entry->params & p) params.push_back(absl::StrCat(ShownName(p), "=", ParamValue(a, p)));
  }
  if (entry->extras & kStaleness) params.push_back(absl::StrCat("s=", a.staleness()));
  if (!params.empty()) absl::StrAppend(&text, ": ", absl::StrJoin(params, ", "));
  absl::StrAppend(&text, absl::StrFormat(" -> overall R_C = %.4g", OverallRatio(a)));
  return text;
}

absl::Status CheckRoundRatio(const v1::AlgorithmConfig& algorithm, int stream,
                             uint32_t ratio) {
  if (stream == kModel && ratio == 1) return absl::OkStatus();
  const Entry* entry = FindEntry(algorithm.name());
  const Rounds rounds = entry == nullptr ? Rounds{} : entry->rounds(algorithm);
  std::vector<std::string> used;
  for (const auto& [s, r] : rounds) {
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
  const Entry* entry = FindEntry(name);
  return entry != nullptr && entry->exchange == Exchange::kSparse;
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
