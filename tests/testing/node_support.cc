#include "tests/testing/node_support.h"

#include <thread>

#include "absl/time/time.h"
#include "worker/group/thread_group.h"

namespace cserps::testing {
namespace {

// Where a client must never connect: nothing listens on port 1.
constexpr char kNowhere[] = "127.0.0.1:1";

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> ConnectLocalRank(v1::JobConfig config,
                                                           uint64_t d,
                                                           uint32_t local_size,
                                                           uint32_t local_rank) {
  for (int s = 0; s < config.cluster().servers_size(); ++s) {
    if (static_cast<uint32_t>(s) % local_size != local_rank) {
      config.mutable_cluster()->set_servers(s, kNowhere);
    }
  }
  PsClientOptions options;
  options.shard_stride = local_size;
  options.shard_offset = local_rank;
  options.setup_timeout = absl::Seconds(20);
  options.rpc_slack = absl::Seconds(5);
  return PsClient::Connect(config, d, options);
}

std::vector<absl::Status> OnEveryProcess(
    uint32_t nodes, uint32_t local_size,
    const std::function<absl::Status(uint32_t, uint32_t, LocalGroup&)>& fn) {
  std::vector<std::vector<std::unique_ptr<ThreadGroup>>> groups;
  for (uint32_t n = 0; n < nodes; ++n) {
    groups.push_back(ThreadGroup::Create(local_size, {.timeout = absl::Seconds(60)}));
  }
  std::vector<absl::Status> status(nodes * local_size);
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < nodes; ++n) {
    for (uint32_t j = 0; j < local_size; ++j) {
      threads.emplace_back([&, n, j] { status[n * local_size + j] = fn(n, j, *groups[n][j]); });
    }
  }
  for (std::thread& t : threads) t.join();
  return status;
}

}  // namespace cserps::testing
