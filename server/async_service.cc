#include "server/async_service.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<AsyncService>> AsyncService::Create(ShardContext* shard) {
  return std::unique_ptr<AsyncService>(new AsyncService(shard));
}

void AsyncService::Shutdown() {}

}  // namespace cserps
