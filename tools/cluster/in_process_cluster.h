// A real cluster inside one process, for tests and benchmarks: S server
// shards on 127.0.0.1 (ephemeral ports) and one registered PsClient per
// rank. Workers are driven by the caller, one thread per rank (synchronous
// rounds block until every rank has pushed). Every server is shut down by
// the destructor.
#ifndef CSERPS_TOOLS_CLUSTER_IN_PROCESS_CLUSTER_H_
#define CSERPS_TOOLS_CLUSTER_IN_PROCESS_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ps_server.h"
#include "worker/ps/ps_client.h"

namespace cserps::testing {

class InProcessCluster {
 public:
  // `config`: defaults applied by Start; cluster.servers gives the number of
  // shards (addresses are replaced). `num_params` is the model size d.
  static absl::StatusOr<std::unique_ptr<InProcessCluster>> Start(
      v1::JobConfig config, uint64_t num_params);
  ~InProcessCluster();

  const v1::JobConfig& config() const { return config_; }
  int num_workers() const { return static_cast<int>(clients_.size()); }
  PsClient& client(int rank) { return *clients_[rank]; }
  PsServer& server(int shard) { return *servers_[shard]; }
  int num_shards() const { return static_cast<int>(servers_.size()); }

  // Stops shard `shard`'s server and starts another at its address with
  // `config` (this cluster's, say with checkpoint.resume): a restarted
  // server process. The clients are left as they are.
  absl::Status RestartShard(int shard, v1::JobConfig config);

  // Runs fn(rank) on one thread per rank, joins them all, and returns the
  // first error (by rank).
  absl::Status OnEveryRank(const std::function<absl::Status(int rank)>& fn);

 private:
  InProcessCluster() = default;

  v1::JobConfig config_;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::unique_ptr<PsClient>> clients_;
};

// A job config from text-format `text` with defaults applied; aborts on a
// parse error (a bug in the test or benchmark that wrote it).
v1::JobConfig TestConfig(const std::string& text);

}  // namespace cserps::testing

#endif  // CSERPS_TOOLS_CLUSTER_IN_PROCESS_CLUSTER_H_
