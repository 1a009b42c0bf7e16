// Directories for files that only this user's processes of a job should
// reach (a node's rendezvous file, its group's socket).
#ifndef CSERPS_COMMON_PRIVATE_DIRECTORY_H_
#define CSERPS_COMMON_PRIVATE_DIRECTORY_H_

#include <string>

#include "absl/status/status.h"

namespace cserps {

// Creates the directory that will hold the file `path` when it is missing,
// with its parents, and gives a directory it created mode 0700. One that
// existed must be this user's, a real directory (not a symbolic link) that
// no other user may write to: FAILED_PRECONDITION naming it otherwise.
// Other errors name `path`, the directory and the failing call, with the
// errno's status code.
absl::Status CreateParentDirectory(const std::string& path);

}  // namespace cserps

#endif  // CSERPS_COMMON_PRIVATE_DIRECTORY_H_
