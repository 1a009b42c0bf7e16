// The one place where absl::Status and grpc::Status are converted. Their
// canonical codes are the same numbers.
#ifndef CSERPS_COMMON_GRPC_STATUS_H_
#define CSERPS_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cserps {

grpc::Status ToGrpcStatus(const absl::Status& status);
// `context` (e.g. "PushPull to shard 1 at 127.0.0.1:5000") prefixes the message.
absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view context = "");

}  // namespace cserps

#endif  // CSERPS_COMMON_GRPC_STATUS_H_
