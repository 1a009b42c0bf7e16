#include "tools/cluster/in_process_cluster.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/status.h"

namespace cserps::testing {

v1::JobConfig TestConfig(const std::string& text) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfig(text, "test config");
  if (!config.ok()) {
    std::fprintf(stderr, "bad test config: %s\n", config.status().ToString().c_str());
    std::abort();
  }
  ApplyDefaults(&*config);
  return *config;
}

absl::StatusOr<std::unique_ptr<InProcessCluster>> InProcessCluster::Start(
    v1::JobConfig config, uint64_t num_params) {
  // The listed ports mean nothing here; one of an earlier cluster's, drawn
  // again by a new shard, would be listed twice.
  for (std::string& address : *config.mutable_cluster()->mutable_servers()) {
    address = "127.0.0.1:0";
  }
  ApplyDefaults(&config);
  RETURN_IF_ERROR(ValidateJobConfig(config, {.allow_port_zero = true}));
  std::unique_ptr<InProcessCluster> cluster(new InProcessCluster());
  for (int s = 0; s < config.cluster().servers_size(); ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server,
                     PsServer::Start(config, s, "127.0.0.1:0"));
    config.mutable_cluster()->set_servers(s, server->address());
    cluster->servers_.push_back(std::move(server));
  }
  cluster->config_ = config;
  for (uint32_t r = 0; r < config.cluster().num_workers(); ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                     PsClient::Connect(config, num_params));
    ASSIGN_OR_RETURN(uint32_t rank,
                     client->Register(static_cast<int>(r), absl::StrCat("test-worker-", r)));
    if (rank != r) return absl::InternalError("registered under another rank");
    cluster->clients_.push_back(std::move(client));
  }
  return cluster;
}

InProcessCluster::~InProcessCluster() {
  clients_.clear();
  for (auto& server : servers_) server->Shutdown();
}

absl::Status InProcessCluster::RestartShard(int shard, v1::JobConfig config) {
  const std::string address = servers_[shard]->address();
  servers_[shard]->Shutdown();
  servers_[shard].reset();
  // The port can be held for a moment by a connection of the old server's,
  // or by another process's outgoing one: try again, for at most 5 s.
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(config, shard, address);
  for (int attempt = 0; !server.ok() && attempt < 50; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    server = PsServer::Start(config, shard, address);
  }
  if (!server.ok()) return server.status();
  servers_[shard] = *std::move(server);
  return absl::OkStatus();
}

absl::Status InProcessCluster::OnEveryRank(
    const std::function<absl::Status(int rank)>& fn) {
  std::vector<absl::Status> status(clients_.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < num_workers(); ++r) {
    threads.emplace_back([&, r] { status[r] = fn(r); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < num_workers(); ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(), absl::StrCat("rank ", r, ": ", status[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace cserps::testing
