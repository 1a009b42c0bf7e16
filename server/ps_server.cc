#include "server/ps_server.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    const v1::JobConfig& config, uint32_t shard,
    const std::string& listen_address,
    ParameterServerService::Options options) {
  std::unique_ptr<PsServer> server(new PsServer());
  ASSIGN_OR_RETURN(server->shard_, ShardContext::Create(config, shard));
  ASSIGN_OR_RETURN(server->service_,
                   ParameterServerService::Create(server->shard_.get(), std::move(options)));
  ASSIGN_OR_RETURN(server->sparse_service_,
                   SparseExchangeService::Create(server->shard_.get()));
  ASSIGN_OR_RETURN(server->async_service_, AsyncService::Create(server->shard_.get()));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.cluster().max_message_bytes()));
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

PsServer::~PsServer() { Shutdown(); }

void PsServer::Shutdown() {
  if (shut_down_.exchange(true)) return;
  // Start() may have failed half-way.
  if (service_ != nullptr) service_->Shutdown();
  if (sparse_service_ != nullptr) sparse_service_->Shutdown();
  if (async_service_ != nullptr) async_service_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
}

void PsServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace cserps
