// The SparseExchange gRPC service of one shard (docs/protocol.md).
#ifndef CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_
#define CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "cserps/v1/sparse.grpc.pb.h"
#include "server/shard_context.h"

namespace cserps {

class SparseExchangeService final : public v1::SparseExchange::CallbackService {
 public:
  // `shard` outlives the service.
  static absl::StatusOr<std::unique_ptr<SparseExchangeService>> Create(ShardContext* shard);

  // Answers every parked call with UNAVAILABLE and refuses new ones; called
  // before grpc::Server::Shutdown.
  void Shutdown();

 private:
  explicit SparseExchangeService(ShardContext* shard) : shard_(*shard) {}

  ShardContext& shard_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_
