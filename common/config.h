// The job config (cserps.v1.JobConfig, proto/cserps/v1/config.proto): one
// include for all that is done with it, each part in its own header.
//
// The usual sequence in a main (LoadJobWithOverrides runs it all):
// LoadJobConfig (config_load.h), ApplyOverride for each command-line
// assignment (config_override.h), ApplyDefaults (config_defaults.h),
// ValidateJobConfig (config_validate.h); then JobFingerprint to tag every
// request, and CompareJobConfigs to explain a fingerprint mismatch
// (config_fingerprint.h). RankBatchSizes (rank_batch_sizes.h) reads the
// per-process batch sizes of a validated config.
//
// Every function is thread-compatible: it only reads or writes its arguments.
// Errors are INVALID_ARGUMENT unless stated otherwise, and their messages
// start with the source name or the field path they are about.
#ifndef CSERPS_COMMON_CONFIG_H_
#define CSERPS_COMMON_CONFIG_H_

#include "common/config_defaults.h"
#include "common/config_fingerprint.h"
#include "common/config_load.h"
#include "common/config_override.h"
#include "common/config_validate.h"
#include "common/rank_batch_sizes.h"

#endif  // CSERPS_COMMON_CONFIG_H_
