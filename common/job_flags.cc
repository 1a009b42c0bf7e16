#include "common/job_flags.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

absl::StatusOr<v1::JobConfig> LoadJobWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides,
    ValidateOptions validate_options) {
  if (path.empty()) {
    return absl::InvalidArgumentError("--config: a job config file is required");
  }
  ASSIGN_OR_RETURN(v1::JobConfig config, LoadJobConfig(path));
  for (const std::string& assignment : overrides) {
    absl::Status status = ApplyOverride(&config, assignment);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("--set ", assignment, ": ", status.message()));
    }
  }
  ApplyDefaults(&config);
  absl::Status valid = ValidateJobConfig(config, validate_options);
  if (!valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat(path, ": ", valid.message()));
  }
  return config;
}

}  // namespace cserps
