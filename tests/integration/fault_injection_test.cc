// Rounds through a faulty network: 8 members reach a real cserps-server
// process through a proxy (tools/cluster/fault_proxy.h) that resets 1% of
// what it forwards, with the request or its reply lost, and delays 5%.
// Over 2000 rounds of small integers, whose means are exact in float
// (tools/cluster/exact_rounds.h), every member's every reply is checked
// against the exact mean: a lost contribution or one counted twice would
// change it. The server completes each round once and fails none, and its
// memory stays flat. The client sends lost calls again
// (worker/ps/call_batch.h); the second case's 320 KB pushes are what
// gRPC's own retries, now off, once left waiting for their deadline.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/cluster/exact_rounds.h"
#include "tools/cluster/fault_proxy.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/server_processes.h"

namespace cserps {
namespace {

// AddressSanitizer keeps freed memory in quarantine and its allocator's
// caches, so a server built with it grows whatever its own allocations do:
// the memory check means nothing there.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

namespace fs = std::filesystem;

struct Case {
  std::string name;
  uint64_t rounds;
  uint64_t d;
  // Memory is compared between the end of this round and the last; 0: not
  // compared (the large case's heap grows for a few hundred rounds before it
  // settles: more rounds than the test runs).
  uint64_t warm_up;
};

std::string Job(uint64_t d) {
  return absl::StrCat(R"pb(
    name: "fault-injection-test"
    seed: 3
    cluster {
      servers: "127.0.0.1:0"
      num_workers: 8
      round_timeout_s: 30
      transport: GRPC
    }
    model { kind: FLAT num_params: )pb", d, R"pb( }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" block_size: 100 }
    epochs: 1
  )pb");
}

class FaultInjectionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FaultInjectionTest, EveryRoundThroughResetsAndDelaysHasTheExactMean) {
  const Case& c = GetParam();
  const std::string job = Job(c.d);
  const fs::path config_path =
      fs::path(::testing::TempDir()) /
      absl::StrCat("fault_injection_test.", getpid(), ".", c.name, ".textproto");
  {
    std::ofstream out(config_path);
    out << job;
  }
  absl::StatusOr<std::unique_ptr<ServerProcesses>> server =
      ServerProcesses::Start(CSERPS_SERVER_BIN, config_path.string(), 1, {"--bulk_port=-1"});
  fs::remove(config_path);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->addresses()[0];
  absl::StatusOr<std::unique_ptr<FaultProxy>> proxy = FaultProxy::Start(
      "127.0.0.1", std::stoi(address.substr(address.rfind(':') + 1)),
      {.reset_probability = 0.01, .delay_probability = 0.05, .seed = 11});
  ASSERT_TRUE(proxy.ok()) << proxy.status();

  v1::JobConfig config = testing::TestConfig(job);
  config.mutable_cluster()->set_servers(0, absl::StrCat("127.0.0.1:", (*proxy)->port()));
  absl::StatusOr<ExactRoundsResult> result = RunExactRounds(
      config, {.rounds = c.rounds, .server_pid = (*server)->pid(0), .warm_up = c.warm_up});
  ASSERT_TRUE(result.ok()) << result.status();
  for (size_t r = 0; r < result->failed.size(); ++r) {
    EXPECT_TRUE(result->failed[r].ok()) << "member " << r << ": " << result->failed[r];
  }
  EXPECT_EQ(result->wrong_means, 0u) << "means that are not exact";
  // A direct client, past the proxy.
  v1::JobConfig direct = config;
  direct.mutable_cluster()->set_servers(0, address);
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(direct, c.d);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::GetStatusResponse> status = (*client)->GetStatus(0);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->rounds_completed(), c.rounds) << "a round completed twice or not at all";
  EXPECT_EQ(status->rounds_failed(), 0u);
  // The faults happened.
  EXPECT_GT((*proxy)->resets(), 10u);
  if (c.warm_up > 0 && !kAddressSanitizer) {
    ASSERT_GT(result->rss_after_warm_up, 0u);
    EXPECT_LE(static_cast<double>(result->rss_at_end),
              1.1 * static_cast<double>(result->rss_after_warm_up))
        << "server RSS grew from " << result->rss_after_warm_up << " to " << result->rss_at_end
        << " bytes";
  }
  std::printf("fault injection: %llu rounds x 8 members of %llu floats, %llu connections, %llu "
              "resets, %llu calls sent again by the client; server RSS %.1f MB after round "
              "%llu, %.1f MB at the end\n",
              static_cast<unsigned long long>(c.rounds), static_cast<unsigned long long>(c.d),
              static_cast<unsigned long long>((*proxy)->connections()),
              static_cast<unsigned long long>((*proxy)->resets()),
              static_cast<unsigned long long>(result->retries), result->rss_after_warm_up / 1e6,
              static_cast<unsigned long long>(c.warm_up), result->rss_at_end / 1e6);
  (*proxy)->Stop();
}

INSTANTIATE_TEST_SUITE_P(Payloads, FaultInjectionTest,
                         ::testing::Values(Case{"small", 2000, 1000, 200},
                                           Case{"large", 150, 80000, 0}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace cserps
