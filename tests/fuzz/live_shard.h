// The live shard the request and bulk frame targets feed: a one-worker
// job's shard in the fuzzer's process on 127.0.0.1 (a 105-float softmax,
// chunks of 16128 floats), its worker registered as rank 0 and the model
// initialised. Any failure to start aborts: the target cannot run.
#ifndef CSERPS_TESTS_FUZZ_LIVE_SHARD_H_
#define CSERPS_TESTS_FUZZ_LIVE_SHARD_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/config_fingerprint.h"
#include "server/ps_server.h"
#include "worker/ps/ps_client.h"

namespace cserps {

struct LiveShard {
  std::unique_ptr<PsServer> server;
  std::unique_ptr<PsClient> client;  // over gRPC
  uint64_t fingerprint = 0;
};

// `algorithm`: the fields of the job's algorithm but block_size, as text.
// Lives as long as the fuzzer.
inline LiveShard* StartLiveShard(const std::string& algorithm) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfig(
      "name: 'fuzz' cluster { servers: '127.0.0.1:0' num_workers: 1 round_timeout_s: 5 "
      "max_message_bytes: 65536 } model { kind: SOFTMAX input_dim: 20 num_classes: 5 } "
      "data { batch_size: 1 } optimizer { lr: 0.1 } epochs: 1 algorithm { block_size: 8 " +
          algorithm + " }",
      "fuzz");
  if (!config.ok()) std::abort();
  ApplyDefaults(&*config);
  auto* shard = new LiveShard();
  absl::StatusOr<std::unique_ptr<PsServer>> server = PsServer::Start(*config, 0, "127.0.0.1:0");
  if (!server.ok()) std::abort();
  shard->server = *std::move(server);
  config->mutable_cluster()->set_servers(0, shard->server->address());
  config->mutable_cluster()->set_transport(v1::ClusterConfig::GRPC);
  constexpr uint64_t kFloats = 20 * 5 + 5;
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(*config, kFloats);
  if (!client.ok() || !(*client)->Register(0, "fuzz").ok()) std::abort();
  shard->client = *std::move(client);
  if (!shard->client->PushModel(std::vector<float>(kFloats, 0.5f)).ok()) std::abort();
  shard->fingerprint = JobFingerprint(*config);
  return shard;
}

}  // namespace cserps

#endif  // CSERPS_TESTS_FUZZ_LIVE_SHARD_H_
