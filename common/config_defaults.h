// ApplyDefaults: the documented default of every job config field
// (cserps.v1.JobConfig) that a config file may leave out.
//
// Thread-compatible: it only reads and writes its argument.
#ifndef CSERPS_COMMON_CONFIG_DEFAULTS_H_
#define CSERPS_COMMON_CONFIG_DEFAULTS_H_

#include "cserps/v1/config.pb.h"

namespace cserps {

// Fills the documented defaults of fields left at zero/empty:
// cluster.max_message_bytes 4 MiB, round_timeout_s 60, max_step_lag 8,
// retained_rounds 4, local_size 1; model.input_dim 784 (a CNN: conv_channels
// [16, 32], kernel_size 5, a 28 x 28 x 1 image and input_dim its size),
// num_classes 10; data.dir
// /usr/share/datasets/fashion-mnist; optimizer.momentum_kind NONE and
// schedule CONSTANT when UNSPECIFIED; algorithm.name "ssgd",
// algorithm.block_size 1024; log_every_steps 50; evals_per_epoch 1;
// output_dir "out".
// Idempotent. Call before ValidateJobConfig. Note that a field explicitly set
// to zero (e.g. log_every_steps 0, "never") is indistinguishable from an unset
// one in proto3 and gets the default.
void ApplyDefaults(v1::JobConfig* config);

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_DEFAULTS_H_
