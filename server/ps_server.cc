#include "server/ps_server.h"

#include <grpc/grpc.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_security.h"
#include "common/status.h"
#include "server/service_options.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    const v1::JobConfig& config, uint32_t shard,
    const std::string& listen_address,
    ParameterServerService::Options options, MetricsRegistry* metrics, int bulk_port) {
  // A published port is told to workers as it is: one out of range would
  // not be the port bound (the resolver takes it modulo 65536).
  if (bulk_port < -1 || bulk_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bulk_port ", bulk_port, " is out of range: -1 turns the bulk transport "
                     "off, 0 picks a free port, else 1..65535"));
  }
  std::unique_ptr<PsServer> server(new PsServer());
  ASSIGN_OR_RETURN(server->shard_, ShardContext::Create(config, shard));
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(server->metrics_, ServerMetrics::Create(metrics, shard));
  }
  if (!options.now) options.now = RealNow;
  const std::function<absl::Time()> now = options.now;
  ASSIGN_OR_RETURN(server->service_,
                   ParameterServerService::Create(server->shard_.get(), std::move(options)));
  ASSIGN_OR_RETURN(server->sparse_service_,
                   SparseExchangeService::Create(server->shard_.get(), {.now = now}));
  ASSIGN_OR_RETURN(server->async_service_,
                   AsyncService::Create(server->shard_.get(), {.now = now}));
  {
    SparseExchangeService* sparse = server->sparse_service_.get();
    AsyncService* async = server->async_service_.get();
    server->service_->set_other_services_traffic([sparse, async] {
      const SparseExchangeService::Counters sc = sparse->counters();
      const AsyncService::Counters ac = async->counters();
      TrafficCounts sum;
      sum.request_bytes = sc.traffic.request_bytes + sc.refused.request_bytes +
                          ac.traffic.request_bytes + ac.refused.request_bytes;
      sum.reply_bytes = sc.traffic.reply_bytes + ac.traffic.reply_bytes;
      return sum;
    });
    server->service_->set_on_roll_back(
        [sparse](uint64_t step, const std::string& reason,
                 const CheckpointReload& reload) {
          return sparse->RollBack(step, reason, reload);
        });
  }
  if (ShardCheckpoint* checkpoint = server->service_->checkpoint();
      checkpoint != nullptr && server->sparse_service_->checkpoints_momentum()) {
    SparseExchangeService* sparse = server->sparse_service_.get();
    checkpoint->AddSection(SparseExchangeService::kMomentumSection,
                           [sparse] { return sparse->MomentumForCheckpoint(); });
  }
  if (bulk_port >= 0) {
    std::string host;
    int unused = 0;
    RETURN_IF_ERROR(SplitHostPort(listen_address, &host, &unused));
    absl::StatusOr<std::unique_ptr<BulkServer>> bulk =
        BulkServer::Start(server->shard_.get(), server->service_.get(),
                          server->sparse_service_.get(), server->async_service_.get(), host,
                          bulk_port);
    if (!bulk.ok()) {
      return absl::Status(bulk.status().code(),
                          absl::StrCat("shard ", shard, ": listening on ", listen_address, ": ",
                                       bulk.status().message()));
    }
    server->bulk_ = *std::move(bulk);
    server->service_->set_bulk_port(static_cast<uint32_t>(server->bulk_->port()));
  }
  grpc::ServerBuilder builder;
  int port = 0;
  ShardContext& shard_context = *server->shard_;
  builder.AddListeningPort(
      listen_address,
      MakeServerCredentials(shard_context.security(), shard_context.bad_certificate_counter()),
      &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(kHandshakeTimeout)));
  // gRPC shares a port on Linux by default (SO_REUSEPORT): a second shard
  // started on a port in use (an address spelled another way in
  // cluster.servers) would take half its connections instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (server->metrics_ != nullptr) {
    ServerMetrics* m = server->metrics_.get();
    ParameterServerService* service = server->service_.get();
    SparseExchangeService* sparse = server->sparse_service_.get();
    AsyncService* async = server->async_service_.get();
    const ShardContext* context = server->shard_.get();
    service->SetRoundLatencyObserver([m](const RoundKey& key, absl::Duration latency) {
      m->ObserveRoundLatency(
          v1::Stream_IsValid(key.stream) ? v1::Stream_Name(key.stream) : "other",
          latency);
    });
    sparse->SetRoundLatencyObserver(
        [m](absl::Duration latency) { m->ObserveRoundLatency("sparse", latency); });
    server->metrics_->Attach([service, sparse, async, context, now] {
      const ParameterServerService::Counters c = service->counters();
      const SparseExchangeService::Counters sc = sparse->counters();
      const AsyncService::Counters ac = async->counters();
      ServerMetrics::Snapshot s;
      s.rounds_completed = {{"GRAD", c.grad_rounds_completed},
                            {"MODEL", c.model_rounds_completed},
                            {"CHECKPOINT", c.checkpoint_rounds_completed},
                            {"sparse", sc.rounds_completed},
                            {"async", ac.pushes_applied}};
      s.rounds_failed = {{"GRAD", c.grad_rounds_failed},
                         {"MODEL", c.model_rounds_failed},
                         {"CHECKPOINT", c.checkpoint_rounds_failed},
                         {"sparse", sc.rounds_failed},
                         {"async", ac.pushes_failed}};
      s.members_registered = c.registered;
      s.members_alive = context->activity().Alive(now());
      s.members_dropped = c.dropped;
      s.members_admitted = c.admitted;
      s.open_rounds = c.open_rounds + sc.open_rounds;
      s.newest_step = std::max({c.newest_step, sc.newest_step, ac.newest_step});
      s.bytes_in = {{"GRAD", c.grad.request_bytes},
                    {"MODEL", c.model.request_bytes},
                    {"CHECKPOINT", c.checkpoint.request_bytes},
                    {"sparse", sc.traffic.request_bytes},
                    {"async", ac.traffic.request_bytes},
                    {"other", c.other.request_bytes + sc.refused.request_bytes +
                                  ac.refused.request_bytes}};
      s.refused = {{"unauthenticated", context->unauthenticated()},
                   {"bad_certificate", context->bad_certificates()},
                   {"bad_input", context->bad_input()}};
      s.bytes_out = {{"GRAD", c.grad.reply_bytes},
                     {"MODEL", c.model.reply_bytes},
                     {"CHECKPOINT", c.checkpoint.reply_bytes},
                     {"sparse", sc.traffic.reply_bytes},
                     {"async", ac.traffic.reply_bytes},
                     {"other", c.other.reply_bytes}};
      return s;
    });
  }
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->sparse_service_.get());
  builder.RegisterService(server->async_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard, ": cannot listen on ", listen_address,
        " (address in use or not local?)"));
  }
  const size_t colon = listen_address.rfind(':');
  server->address_ = absl::StrCat(listen_address.substr(0, colon), ":", port);
  return server;
}

PsServer::~PsServer() {
  // A scrape must not read the service while it is destroyed.
  if (metrics_ != nullptr) metrics_->Detach();
  Shutdown();
}

void PsServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  // Start() may have failed half-way.
  if (service_ != nullptr) service_->Shutdown();
  if (sparse_service_ != nullptr) sparse_service_->Shutdown();
  if (async_service_ != nullptr) async_service_->Shutdown();
  // After the services' Shutdown, whose failed rounds and pushes it still
  // answers.
  if (bulk_ != nullptr) bulk_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
}

void PsServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cserps
