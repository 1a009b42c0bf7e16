// Loading the job config the way every binary does: the file, then "--set"
// overrides, then defaults, then validation.
#ifndef CSERPS_COMMON_JOB_FLAGS_H_
#define CSERPS_COMMON_JOB_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"

namespace cserps {

absl::StatusOr<v1::JobConfig> LoadJobWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides,
    ValidateOptions validate_options = {});

}  // namespace cserps

#endif  // CSERPS_COMMON_JOB_FLAGS_H_
