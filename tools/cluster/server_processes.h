// The cserps-server processes of one job on 127.0.0.1, for benchmarks and
// tests that measure a real server process: each on a free port, its output
// drained so that its log never blocks it, all stopped (SIGTERM, then
// SIGKILL after 10 s) by the destructor.
#ifndef CSERPS_TOOLS_CLUSTER_SERVER_PROCESSES_H_
#define CSERPS_TOOLS_CLUSTER_SERVER_PROCESSES_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/cluster/child_process.h"

namespace cserps {

class ServerProcesses {
 public:
  // Starts shards 0 .. count-1 of `config` (a file) with `program`, each
  // with --listen=127.0.0.1:0 and `extra_args`, and waits up to 30 s for
  // each to report its address.
  static absl::StatusOr<std::unique_ptr<ServerProcesses>> Start(
      const std::string& program, const std::string& config, int count,
      const std::vector<std::string>& extra_args = {});
  ~ServerProcesses();

  // "127.0.0.1:port" by shard.
  const std::vector<std::string>& addresses() const { return addresses_; }
  pid_t pid(int shard) const { return children_[shard].pid(); }
  // Waits up to `timeout` for shard's process to exit on its own; its exit
  // code (128 + the signal when killed), or nullopt when it still runs.
  std::optional<int> AwaitExit(int shard, absl::Duration timeout);
  // User + system CPU seconds of all of them.
  double CpuSeconds() const;

 private:
  ServerProcesses() = default;
  absl::StatusOr<std::string> AwaitAddress(int shard);

  std::vector<ChildProcess> children_;
  std::vector<std::string> addresses_;
  std::vector<std::thread> drains_;
};

// User + system CPU seconds of process `pid` (/proc/<pid>/stat); 0 when it
// cannot be read.
double ProcessCpuSeconds(pid_t pid);
// Resident set size of process `pid` in bytes (/proc/<pid>/status VmRSS);
// 0 when it cannot be read.
uint64_t ProcessRssBytes(pid_t pid);

}  // namespace cserps

#endif  // CSERPS_TOOLS_CLUSTER_SERVER_PROCESSES_H_
