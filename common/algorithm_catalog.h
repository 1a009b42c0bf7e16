// The registry of the algorithms a job config may choose (algorithm.name),
// known to both servers and workers: each one's properties (how it reaches
// the servers, whether a node of several local ranks can run it, which
// parameters it reads, which (stream, ratio) rounds it uses) and its overall
// compression ratio R_C against S-SGD (ALGORITHMS.md). The worker makes the
// implementation of an entry from its id (worker/algorithms/registry.h).
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

enum class AlgorithmId {
  kAsyncSgd,
  kCocodSgd,
  kCsea,
  kCser,
  kCserPl,
  kEfSgd,
  kGtopkSsgd,
  kLocalSgd,
  kMCser,
  kPipeSgd,
  kQsparseLocalSgd,
  kSsgd,
  kTopkSsgd,
};

// How an algorithm's steps reach the servers.
enum class Exchange {
  kAverages,  // averaging rounds of GRBS-selected blocks (PushPull)
  kSparse,    // the sparse top-k exchange (SparsePushPull)
  kAsync,     // asynchronous pushes (AsyncPushPull)
};

struct AlgorithmInfo {
  AlgorithmId id = AlgorithmId::kSsgd;
  std::string name;  // the value of algorithm.name, e.g. "ssgd"
  Exchange exchange = Exchange::kAverages;
  // m-cser: CSER with Nesterov momentum (optimizer.momentum_kind NESTEROV).
  bool needs_nesterov = false;

  // Whether the local ranks of a node (cluster.local_size > 1) can run it:
  // only averages have an intra-node form.
  bool runs_on_node() const { return exchange == Exchange::kAverages; }
  // Whether a running job can roll back to a checkpoint in place when a
  // server restarts (docs/reliability.md): all but async-sgd, which takes
  // no checkpoints.
  bool rolls_back_in_place() const { return exchange != Exchange::kAsync; }
};

// Every known algorithm, sorted by name. The reference lives for the whole
// program.
const std::vector<AlgorithmInfo>& KnownAlgorithms();

// The entry named `name` (exact, case-sensitive match), or NOT_FOUND
// "algorithm.name: unknown algorithm "x"; known: async-sgd, cocod-sgd, ..." listing
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

// Whether the algorithm `name` uses the sparse exchange (gtopk-ssgd,
// topk-ssgd); false for an unknown name.
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
