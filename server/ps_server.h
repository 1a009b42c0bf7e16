// A running gRPC server for one shard: the service plus its listening
// socket. Used by cserps-server and by tests that run servers in-process.
#ifndef CSERPS_SERVER_PS_SERVER_H_
#define CSERPS_SERVER_PS_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "server/async_service.h"
#include "server/bulk_server.h"
#include "server/parameter_server_service.h"
#include "server/sparse_exchange_service.h"
#include "server/shard_context.h"

namespace cserps {

class PsServer {
 public:
  // How long a connection may take to finish its handshake (TLS, then the
  // first HTTP/2 settings) before the server closes it, so that connections
  // opened and left silent do not stay.
  static constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

  // Listens on `listen_address` ("host:port"; port 0 picks a free port).
  // `options.now` is the clock of every service of the shard (round
  // timeouts, async liveness, member activity); `options.expiry_thread`
  // applies to the ParameterServer service only. With `metrics` (which
  // outlives the server), exports the shard's ServerMetrics there, every
  // service counted. The bulk transport (bulk_server.h) listens on
  // `listen_address`'s host at `bulk_port` (0: a free port; -1: none;
  // INVALID_ARGUMENT outside -1..65535), with TLS when the job has it. With
  // TLS the server requires client certificates signed by the job's CA.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(
      const v1::JobConfig& config, uint32_t shard,
      const std::string& listen_address,
      ParameterServerService::Options options = {},
      MetricsRegistry* metrics = nullptr, int bulk_port = 0);
  ~PsServer();

  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // The bulk transport's port; 0 when it has none.
  int bulk_port() const { return bulk_ != nullptr ? bulk_->port() : 0; }
  ParameterServerService& service() { return *service_; }
  const ShardContext& shard() const { return *shard_; }
  SparseExchangeService& sparse_service() { return *sparse_service_; }
  AsyncService& async_service() { return *async_service_; }
  // Rounds failed so far, dense and sparse (timed out, or at shutdown).
  uint64_t rounds_failed() const {
    return service_->counters().rounds_failed + sparse_service_->counters().rounds_failed;
  }

  // A roll back failed: the shard serves no more rounds, and its process
  // must end (ParameterServerService::roll_back_failed).
  bool roll_back_failed() const { return service_->roll_back_failed(); }

  // Fails parked calls, then stops the server. Idempotent.
  void Shutdown();
  // Blocks until Shutdown has been called (from another thread).
  void Wait();

 private:
  PsServer() = default;

  std::unique_ptr<ShardContext> shard_;
  // Declared before service_, whose latency hook uses it; detached from the
  // service by the destructor.
  std::unique_ptr<ServerMetrics> metrics_;
  // Every service of the shard; declared after shard_, which they use.
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<SparseExchangeService> sparse_service_;
  std::unique_ptr<AsyncService> async_service_;
  // After service_, which it feeds.
  std::unique_ptr<BulkServer> bulk_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace cserps

#endif  // CSERPS_SERVER_PS_SERVER_H_
