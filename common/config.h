// Loading, overriding, defaulting, validating and fingerprinting the job
// config (cserps.v1.JobConfig, proto/cserps/v1/config.proto).
//
// The usual sequence in a main: LoadJobConfig, ApplyOverride for each
// command-line assignment, ApplyDefaults, ValidateJobConfig; then
// JobFingerprint to tag every request, and CompareJobConfigs to explain a
// fingerprint mismatch.
//
// Every function is thread-compatible: it only reads or writes its arguments.
// Errors are INVALID_ARGUMENT unless stated otherwise, and their messages
// start with the source name or the field path they are about.
#ifndef CSERPS_COMMON_CONFIG_H_
#define CSERPS_COMMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// Parses protobuf text format. A syntax error or unknown field →
// INVALID_ARGUMENT "<source_name>:<line>:<column>: <parser message>", line and
// column 1-based (the first error only).
absl::StatusOr<v1::JobConfig> ParseJobConfig(absl::string_view text,
                                             absl::string_view source_name);

// Reads `path` and parses it with the path as source name. A missing file →
// NOT_FOUND naming the path; another read failure → the errno's status code
// naming the path.
absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path);

// Applies one "field.path=value" assignment through protobuf reflection:
//   "seed=7", "optimizer.lr=0.05", "optimizer.momentum_kind=NESTEROV"
//   (enum by value name), "model.hidden=256,128" and
//   "cluster.servers=127.0.0.1:5000,127.0.0.1:5001" (a repeated field is
//   replaced by the comma-separated list; an empty value clears it),
//   "data.dir=/tmp/x" (a singular string takes the value verbatim),
//   "x.flag=true" (bools: true/false/1/0).
// Whitespace around the path and around list items is ignored. Errors name
// the path and say what is wrong (no '=', unknown field, a message given a
// value, a path through a non-message, a value that is not of the field's
// type or out of its range); on error `config` is unchanged.
absl::Status ApplyOverride(v1::JobConfig* config, absl::string_view assignment);

// Fills the documented defaults of fields left at zero/empty:
// cluster.max_message_bytes 4 MiB, round_timeout_s 60, max_step_lag 8,
// retained_rounds 4, local_size 1; model.input_dim 784 (a CNN: conv_channels
// [16, 32], kernel_size 5, a 28 x 28 x 1 image and input_dim its size),
// num_classes 10; data.dir
// /usr/share/datasets/fashion-mnist; optimizer.momentum_kind NONE and
// schedule CONSTANT when UNSPECIFIED; algorithm.name "ssgd",
// algorithm.block_size 1024; log_every_steps 50; output_dir "out".
// Idempotent. Call before ValidateJobConfig. Note that a field explicitly set
// to zero (e.g. log_every_steps 0, "never") is indistinguishable from an unset
// one in proto3 and gets the default.
void ApplyDefaults(v1::JobConfig* config);

struct ValidateOptions {
  // Accept port 0 in cluster.servers: the local launcher asks servers to
  // pick a free port.
  bool allow_port_zero = false;
};

// Checks every field of a defaulted config; the first problem →
// INVALID_ARGUMENT whose message starts with the field path, e.g.
// "optimizer.lr: must be > 0 (got -1)". Rules: cluster.servers non-empty,
// each "host:port" (host may be "[v6addr]") with port in 1..65535 (0 with
// allow_port_zero), no address listed twice (port 0 excepted);
// cluster.num_workers >= 1; max_message_bytes in [64 KiB, 1 GiB];
// round_timeout_s > 0 and finite; retained_rounds >= 1; local_size >= 1 and 1
// for async-sgd, gtopk-ssgd and topk-ssgd; model.kind set, input_dim >= 1,
// num_classes >= 2, MLP hidden non-empty with widths > 0, SOFTMAX hidden
// empty, the CNN's fields only on a CNN and a valid layout (MakeModelSpec);
// data.batch_size >= 1 unless rank_batch_sizes is set, rank_batch_sizes (and
// rank_speeds, rank_slowdown) have num_workers x local_size entries, batch
// sizes >= 1; optimizer.lr > 0 and
// finite, momentum in [0,1) and > 0 for HEAVY_BALL/NESTEROV, weight_decay >= 0
// and finite, enums known, STEP_DECAY: step_epochs >= 1 and gamma in (0,1],
// WARMUP_COSINE: warmup_epochs >= 0 and < epochs; epochs >= 1;
// algorithm.name known (algorithm_catalog.h), block_size >= 1.
absl::Status ValidateJobConfig(const v1::JobConfig& config,
                               ValidateOptions options = {});

// The per-process batch sizes (num_workers x local_size, node-major):
// data.rank_batch_sizes when set, else proportional to rank_speeds, else
// copies of data.batch_size.
std::vector<uint32_t> RankBatchSizes(const v1::JobConfig& config);

// A 64-bit fingerprint of every non-local field. Local fields (ignored):
// cluster.servers addresses (their count is covered), data.dir,
// log_every_steps, output_dir. Computed over the deterministic serialization
// of a normalised copy (defaults applied, local fields cleared) with FNV-1a
// 64, so it is stable across processes, builds and machines, and a config
// equals its defaulted self. Two configs have equal fingerprints exactly when
// CompareJobConfigs finds them equal (up to hash collisions).
uint64_t JobFingerprint(const v1::JobConfig& config);

// OK when the non-local fields agree (after the normalisation of
// JobFingerprint); otherwise FAILED_PRECONDITION naming the first differing
// field path (field-number order, depth first) and both values, e.g.
// "config mismatch at optimizer.lr: server has 0.1, worker has 0.05".
// `mine_label` / `theirs_label` name the two sides in the message. Repeated
// fields are shown as lists; for cluster.servers only the counts.
absl::Status CompareJobConfigs(const v1::JobConfig& mine,
                               const v1::JobConfig& theirs,
                               absl::string_view mine_label,
                               absl::string_view theirs_label);

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_H_
