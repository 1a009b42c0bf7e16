// The algorithms a job config may choose (algorithm.name), known to both
// servers and workers: which parameters each reads, which (stream, ratio)
// rounds it uses, and its overall compression ratio R_C against S-SGD
// (ALGORITHMS.md). The worker-side implementations are registered by the
// same names in worker/algorithms/.
//
// Thread-safe: the catalog is immutable.
#ifndef CSERPS_COMMON_ALGORITHM_CATALOG_H_
#define CSERPS_COMMON_ALGORITHM_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

struct AlgorithmInfo {
  std::string name;     // the value of algorithm.name, e.g. "ssgd"
  std::string summary;  // one line for users: update rule, streams, ratio
};

// Every known algorithm, sorted by name. The reference lives for the whole
// program.
const std::vector<AlgorithmInfo>& KnownAlgorithms();

// The entry named `name` (exact, case-sensitive match), or NOT_FOUND
// "algorithm.name: unknown algorithm "x"; known: cser, csea, ..." listing
// every known name.
absl::StatusOr<AlgorithmInfo> FindAlgorithm(absl::string_view name);

// Checks the parameters of the chosen algorithm: the ones it reads are set
// and sane, the ones it does not read are 0 (a set but unused field is a
// misunderstanding worth reporting). INVALID_ARGUMENT naming the field.
absl::Status ValidateAlgorithm(const v1::AlgorithmConfig& algorithm,
                               const v1::OptimizerConfig& optimizer);

// R_C: S-SGD's floats per step over the algorithm's, from its parameters:
// cser GRADIENT_BLOCKS 1 / (1/R_C2 + 1/(R_C1·H)) (the paper's); cser
// MODEL_BLOCKS H / ((H−1)/R_C2 + 1/R_C1), since its sync step sends the R_C1
// round instead of the R_C2 one (33.0 instead of 32 for (4, 64, 16)). The
// achieved ratio differs slightly because GRBS rounds the number of blocks.
double OverallRatio(const v1::AlgorithmConfig& algorithm);

// "cser (MODEL_BLOCKS): H=16, R_C1=4, R_C2=64 -> overall R_C = 32".
std::string DescribeAlgorithm(const v1::AlgorithmConfig& algorithm);

// Whether a round of `ratio` on `stream` (a cserps.v1.Stream value) belongs to
// the job; MODEL at ratio 1 (the full average that ends training) always
// does. The error names what the algorithm uses instead.
absl::Status CheckRoundRatio(const v1::AlgorithmConfig& algorithm, int stream,
                             uint32_t ratio);

// gtopk-ssgd and topk-ssgd: the algorithms that use the sparse exchange.
bool IsSparseTopk(absl::string_view name);

// k of the sparse methods: max(1, round(density * d)) (round half away from
// zero, in double), at most d; 0 when d is 0.
uint64_t SparseK(const v1::AlgorithmConfig& algorithm, uint64_t num_params);

// k_s, the entries per member on a shard of `shard_size` floats of a model of
// d = `num_params`: max(1, floor((2·k·size + d) / (2·d))), i.e. k·size/d
// rounded half up, in exact integer arithmetic; at most `shard_size`; 0 for
// an empty shard (docs/protocol.md 14.2). The k_s of all shards need not sum
// to k.
uint64_t ShardSparseK(uint64_t k, uint64_t shard_size, uint64_t num_params);

}  // namespace cserps

#endif  // CSERPS_COMMON_ALGORITHM_CATALOG_H_
