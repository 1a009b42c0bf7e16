// Command-line overrides of job config (cserps.v1.JobConfig) fields: the
// "--set='a.b=v;c=w'" assignments every binary accepts on top of its config
// file.
//
// Thread-compatible: each function only reads and writes its arguments.
#ifndef CSERPS_COMMON_CONFIG_OVERRIDE_H_
#define CSERPS_COMMON_CONFIG_OVERRIDE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// Splits a "--set" flag value into its assignments. They are separated by
// ';' because list values use ','; empty and all-whitespace pieces are
// dropped.
std::vector<std::string> SplitOverrides(absl::string_view flag);

// The values of every --set in `argv` (before a "--"), joined by ';' in
// their order, when there are several; none otherwise. A flag parser keeps
// only the last, and the others would be dropped without a word.
std::optional<std::string> RepeatedSetFlags(int argc, char** argv);

// Applies one "field.path=value" assignment through protobuf reflection:
//   "seed=7", "optimizer.lr=0.05", "optimizer.momentum_kind=NESTEROV"
//   (enum by value name), "model.hidden=256,128" and
//   "cluster.servers=127.0.0.1:5000,127.0.0.1:5001" (a repeated field is
//   replaced by the comma-separated list; an empty value clears it),
//   "data.dir=/tmp/x" (a singular string takes the value verbatim),
//   "x.flag=true" (bools: true/false/1/0).
// Whitespace around the path and around list items is ignored. Errors are
// INVALID_ARGUMENT naming the path and saying what is wrong (no '=', unknown
// field, a message given a value, a path through a non-message, a value that
// is not of the field's type or out of its range); on error `config` is
// unchanged.
absl::Status ApplyOverride(v1::JobConfig* config, absl::string_view assignment);

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_OVERRIDE_H_
