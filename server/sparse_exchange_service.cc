#include "server/sparse_exchange_service.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<SparseExchangeService>> SparseExchangeService::Create(ShardContext* shard) {
  return std::unique_ptr<SparseExchangeService>(new SparseExchangeService(shard));
}

void SparseExchangeService::Shutdown() {}

}  // namespace cserps
