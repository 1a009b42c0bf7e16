// The flags cserps-server and cserps-worker share for how a process
// starts from the job's checkpoints (docs/reliability.md): --resume and
// --restart_on_failure, which set checkpoint.resume and
// checkpoint.restart_on_failure.
#ifndef CSERPS_COMMON_START_FLAGS_H_
#define CSERPS_COMMON_START_FLAGS_H_

#include <string>
#include <vector>

namespace cserps {

// `overrides` (--set's) with the settings the two flags ask for appended.
std::vector<std::string> WithStartFlags(std::vector<std::string> overrides);

}  // namespace cserps

#endif  // CSERPS_COMMON_START_FLAGS_H_
