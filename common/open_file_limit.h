// A server holds one file descriptor per connection. Debian's gRPC (1.51)
// stops accepting on a port for good once accept() fails for lack of
// descriptors (grpc/grpc#16058, #20418), so a server raises its soft limit
// to the hard one at start, as Go's runtime does for every program.
#ifndef CSERPS_COMMON_OPEN_FILE_LIMIT_H_
#define CSERPS_COMMON_OPEN_FILE_LIMIT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace cserps {

// Sets RLIMIT_NOFILE's soft limit to its hard limit and returns the limit
// now in force. INTERNAL, naming the call, when the limit cannot be read or
// set.
absl::StatusOr<uint64_t> RaiseOpenFileLimit();

}  // namespace cserps

#endif  // CSERPS_COMMON_OPEN_FILE_LIMIT_H_
