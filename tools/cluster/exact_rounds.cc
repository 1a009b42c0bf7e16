#include "tools/cluster/exact_rounds.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "tools/cluster/server_processes.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

float Value(uint32_t rank, uint64_t t, uint64_t i) {
  return static_cast<float>((3 * rank + i + t) % 5);
}

}  // namespace

absl::StatusOr<ExactRoundsResult> RunExactRounds(const v1::JobConfig& config,
                                                 const ExactRoundsOptions& options) {
  const uint32_t members = config.cluster().num_workers();
  const uint64_t d = config.model().num_params();
  if (members > 16) {
    return absl::InvalidArgumentError(absl::StrCat(members, " members: at most 16 keep the means exact"));
  }
  std::vector<std::unique_ptr<PsClient>> clients;
  for (uint32_t r = 0; r < members; ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(config, d));
    RETURN_IF_ERROR(client->Register(static_cast<int>(r), absl::StrCat("member-", r)).status());
    clients.push_back(std::move(client));
  }
  ExactRoundsResult result;
  result.failed.resize(members);
  std::vector<uint64_t> wrong(members, 0);
  std::vector<std::vector<absl::Duration>> latencies(members);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < members; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> values(d), mean(d);
      for (uint64_t t = 0; t < options.rounds; ++t) {
        for (uint64_t i = 0; i < d; ++i) values[i] = Value(r, t, i);
        const absl::Time begin = absl::Now();
        const absl::Status status =
            clients[r]->AverageBlocks(v1::MODEL, t, 1, values, 1.0f, 0.0f, absl::MakeSpan(mean));
        latencies[r].push_back(absl::Now() - begin);
        if (!status.ok()) {
          result.failed[r] =
              absl::Status(status.code(), absl::StrCat("round ", t, ": ", status.message()));
          return;
        }
        for (uint64_t i = 0; i < d; ++i) {
          float sum = 0;
          for (uint32_t k = 0; k < members; ++k) sum += Value(k, t, i);
          if (mean[i] != sum / static_cast<float>(members)) ++wrong[r];
        }
        if (r == 0 && options.server_pid != 0 && t + 1 == options.warm_up) {
          result.rss_after_warm_up = ProcessRssBytes(options.server_pid);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  result.wall = absl::Now() - start;
  if (options.server_pid != 0) result.rss_at_end = ProcessRssBytes(options.server_pid);
  for (uint32_t r = 0; r < members; ++r) {
    result.wrong_means += wrong[r];
    result.retries += clients[r]->retries();
    result.latencies.insert(result.latencies.end(), latencies[r].begin(), latencies[r].end());
  }
  return result;
}

}  // namespace cserps
