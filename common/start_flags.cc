#include "common/start_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(bool, restart_on_failure, false,
          "For restart policies (checkpoint.restart_on_failure=true): resume from the newest "
          "complete checkpoint when there is one, else start fresh; exit when the job has "
          "lost a process, for the policy to restart it.");
ABSL_FLAG(bool, resume, false,
          "Start from the newest complete checkpoint of the job in checkpoint.dir "
          "(checkpoint.resume=true); without one, fail rather than start fresh.");

namespace cserps {

std::vector<std::string> WithStartFlags(std::vector<std::string> overrides) {
  if (absl::GetFlag(FLAGS_resume)) overrides.push_back("checkpoint.resume=true");
  if (absl::GetFlag(FLAGS_restart_on_failure)) {
    overrides.push_back("checkpoint.restart_on_failure=true");
  }
  return overrides;
}

}  // namespace cserps
