// Small pieces every callback service of a shard uses.
#ifndef CSERPS_SERVER_UNARY_REPLY_H_
#define CSERPS_SERVER_UNARY_REPLY_H_

#include <grpcpp/support/server_callback.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace cserps {

// Answers a unary call at once with `status` (its only Finish).
inline grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                            const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// The real clock, for services whose Options leave `now` unset.
inline absl::Time RealNow() { return absl::Now(); }

}  // namespace cserps

#endif  // CSERPS_SERVER_UNARY_REPLY_H_
