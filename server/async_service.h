// The AsyncParameterServer gRPC service of one shard (docs/protocol.md).
#ifndef CSERPS_SERVER_ASYNC_SERVICE_H_
#define CSERPS_SERVER_ASYNC_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cserps/v1/async_sgd.grpc.pb.h"
#include "server/shard_context.h"

namespace cserps {

class AsyncService final : public v1::AsyncParameterServer::CallbackService {
 public:
  // `shard` outlives the service.
  static absl::StatusOr<std::unique_ptr<AsyncService>> Create(ShardContext* shard);

  // Answers every parked call with UNAVAILABLE and refuses new ones; called
  // before grpc::Server::Shutdown.
  void Shutdown();

 private:
  explicit AsyncService(ShardContext* shard) : shard_(*shard) {}

  ShardContext& shard_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ASYNC_SERVICE_H_
