// The bulk transport of one shard (docs/protocol.md 17): PushPull and
// SparsePushPull rounds and AsyncPushPull calls over TCP, with TLS when the
// job has it, next to the gRPC services, into the same rounds, so a round
// may mix members of both. A request's payload is read into a buffer of its
// own and added to the round from there; each reply is written from the
// round's mean (or sparse reply), which every member's reply shares, or
// from the chunk an asynchronous push read back.
//
// Threads: an acceptor, and per connection a reader (requests, into the
// rounds) and a writer (replies, in the order rounds complete), so a member
// that is slow to read never holds up the rounds of others.
#ifndef CSERPS_SERVER_BULK_SERVER_H_
#define CSERPS_SERVER_BULK_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_stream.h"
#include "common/socket_io.h"
#include "server/async_service.h"
#include "server/parameter_server_service.h"
#include "server/shard_context.h"
#include "server/sparse_exchange_service.h"

namespace cserps {

class BulkServer {
 public:
  // Connections one member may hold at once (each PsClient opens one per
  // shard; a restarted worker's new one may overlap its old one's end). Its
  // next hello is refused, RESOURCE_EXHAUSTED.
  static constexpr uint32_t kConnectionsPerMember = 4;
  // Connections the shard takes beyond kConnectionsPerMember per member:
  // room for hellos still to come or to be refused. Past those, a connection
  // is closed at once, at no thread's cost.
  static constexpr uint32_t kSpareConnections = 16;

  // Listens on host:port (port 0 picks a free one). `shard` and the
  // services outlive the server.
  static absl::StatusOr<std::unique_ptr<BulkServer>> Start(ShardContext* shard,
                                                           ParameterServerService* service,
                                                           SparseExchangeService* sparse,
                                                           AsyncService* async,
                                                           const std::string& host,
                                                           int port);
  ~BulkServer();

  int port() const { return port_; }
  // Connections open now.
  size_t open_connections() const;

  // Stops accepting, ends every connection once its queued replies are sent
  // (at most a few seconds), and joins every thread. Call after the
  // services' Shutdown, whose failed rounds and parked pushes are replies
  // too. Idempotent.
  void Shutdown();

 private:
  class Connection;
  class MemberSlots;
  BulkServer(ShardContext* shard, ParameterServerService* service,
             SparseExchangeService* sparse, AsyncService* async, std::shared_ptr<TlsContext> tls,
             Socket listener, int port);
  void AcceptLoop();
  // Joins and drops the connections whose threads have ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ShardContext& shard_;
  ParameterServerService& service_;
  SparseExchangeService& sparse_;
  AsyncService& async_;
  const std::shared_ptr<TlsContext> tls_;  // null: plaintext
  Socket listener_;
  const int port_;
  const size_t max_connections_;  // members' and spare
  const std::unique_ptr<MemberSlots> slots_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;  // connections closed unanswered
  std::thread acceptor_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_BULK_SERVER_H_
