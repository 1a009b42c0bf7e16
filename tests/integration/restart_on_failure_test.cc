// checkpoint.restart_on_failure on a real cserps-server process: a round
// that fails (a member never pushed: a process of the job died) makes the
// server exit with code 3, for its restart policy to restart the job from
// the newest checkpoint; without the setting it serves on.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/server_processes.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;

class RestartOnFailureTest : public ::testing::TestWithParam<bool> {};

TEST_P(RestartOnFailureTest, AFailedRoundEndsTheServerOnlyWhenRestartable) {
  const bool restartable = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("restart_on_failure_test.", getpid(), ".", restartable);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string job = absl::StrCat(R"pb(
    name: "restart-test"
    cluster { servers: "127.0.0.1:0" num_workers: 2 round_timeout_s: 1 }
    model { kind: FLAT num_params: 100 }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" block_size: 10 }
    epochs: 1
    checkpoint { dir: ")pb", (dir / "ckpt").string(), R"pb(" every_steps: 10 }
  )pb");
  const fs::path config_path = dir / "job.textproto";
  {
    std::ofstream out(config_path);
    out << job;
  }
  absl::StatusOr<std::unique_ptr<ServerProcesses>> server = ServerProcesses::Start(
      CSERPS_SERVER_BIN, config_path.string(), 1,
      restartable ? std::vector<std::string>{"--restart_on_failure"} : std::vector<std::string>{});
  ASSERT_TRUE(server.ok()) << server.status();
  v1::JobConfig config = testing::TestConfig(job);
  config.mutable_cluster()->set_servers(0, (*server)->addresses()[0]);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(config, 100, {.rpc_slack = absl::Seconds(5)});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Register(0, "the-only-one").ok());
  std::vector<float> values(100, 1.0f), mean(100);
  // Rank 1 never pushes: the round times out.
  const absl::Status round =
      (*client)->AverageBlocks(v1::GRAD, 0, 1, values, 1.0f, 0.1f, absl::MakeSpan(mean));
  EXPECT_EQ(round.code(), absl::StatusCode::kDeadlineExceeded) << round;
  const std::optional<int> exit_code = (*server)->AwaitExit(0, absl::Seconds(restartable ? 20 : 3));
  if (restartable) {
    EXPECT_EQ(exit_code, 3);
  } else {
    // Three times the server's check period, and it still answers.
    EXPECT_FALSE(exit_code.has_value()) << "exited with " << *exit_code;
    absl::StatusOr<v1::GetStatusResponse> status = (*client)->GetStatus(0);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->rounds_failed(), 1u);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Settings, RestartOnFailureTest, ::testing::Bool());

}  // namespace
}  // namespace cserps
