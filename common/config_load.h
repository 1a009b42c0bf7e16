// Reading a job config (cserps.v1.JobConfig, proto/cserps/v1/config.proto)
// from protobuf text format, and the whole sequence every binary runs at
// start-up: the file, its "--set" overrides, defaults, validation.
//
// Thread-compatible: each function only reads and writes its arguments and
// the named file.
#ifndef CSERPS_COMMON_CONFIG_LOAD_H_
#define CSERPS_COMMON_CONFIG_LOAD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config_validate.h"
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

// LoadJobConfig(path), then ApplyOverride for each of `overrides` in order
// (SplitOverrides makes them from a "--set" flag), ApplyDefaults and
// ValidateJobConfig with `validate_options`. An empty `path` →
// INVALID_ARGUMENT "--config: a job config file is required"; an override's
// error gets the prefix "--set <assignment>: " and a validation error the
// prefix "<path>: ", each keeping its code.
absl::StatusOr<v1::JobConfig> LoadJobWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides,
    ValidateOptions validate_options = {});

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_LOAD_H_
