// Small pieces every callback service of a shard uses.
#ifndef CSERPS_SERVER_UNARY_REPLY_H_
#define CSERPS_SERVER_UNARY_REPLY_H_

#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"

namespace cserps {

// Answers a unary call at once with `status` (its only Finish).
inline grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                            const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// `status` with its message prefixed by the call it answers ("<call>:
// <message>"); OK stays OK.
inline absl::Status Prefixed(absl::string_view call, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(call, ": ", status.message()));
}

}  // namespace cserps

#endif  // CSERPS_SERVER_UNARY_REPLY_H_
