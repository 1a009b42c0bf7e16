// ValidateJobConfig: the rules a defaulted job config (cserps.v1.JobConfig)
// must satisfy before any process runs it.
//
// Thread-compatible: it only reads its arguments.
#ifndef CSERPS_COMMON_CONFIG_VALIDATE_H_
#define CSERPS_COMMON_CONFIG_VALIDATE_H_

#include "absl/status/status.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

struct ValidateOptions {
  // Accept port 0 in cluster.servers: the local launcher asks servers to
  // pick a free port.
  bool allow_port_zero = false;
};

// Checks every field of a defaulted config (ApplyDefaults); the first problem
// → INVALID_ARGUMENT whose message starts with the field path, e.g.
// "optimizer.lr: must be > 0 (got -1)". Rules: name only letters, digits,
// '-', '_' and '.'; cluster.servers non-empty,
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
// algorithm.name known (algorithm_catalog.h), block_size >= 1, and the
// algorithm's own fields (ValidateAlgorithm).
absl::Status ValidateJobConfig(const v1::JobConfig& config,
                               ValidateOptions options = {});

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_VALIDATE_H_
