// cserps-bench-faults: the fault-injection soak. Starts one cserps-server
// process on 127.0.0.1 and runs M members' rounds of exact small integers
// (tools/cluster/exact_rounds.h) twice: straight to the server, then
// through a proxy that resets and delays what it forwards
// (tools/cluster/fault_proxy.h). Prints, for each, the rounds and their
// latency (p50, p99, max: the longest recovery), the replies that were not
// the exact mean, the members that failed, the resets and the calls sent
// again, the server's completed and failed rounds and its memory after a
// tenth of the rounds and at the end.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/config_defaults.h"
#include "common/config_load.h"
#include "common/status.h"
#include "tools/cluster/exact_rounds.h"
#include "tools/cluster/fault_proxy.h"
#include "tools/cluster/server_processes.h"
#include "worker/ps/ps_client.h"

ABSL_FLAG(int, members, 8, "Members (at most 16).");
ABSL_FLAG(uint64_t, rounds, 20000, "Rounds of each run.");
ABSL_FLAG(uint64_t, floats, 1000, "Floats per member and round.");
ABSL_FLAG(double, reset, 0.01, "Probability that a forwarded piece resets its connection.");
ABSL_FLAG(double, delay, 0.05, "Probability that a forwarded piece is held back 1-4 ms.");
ABSL_FLAG(uint64_t, seed, 11, "Seed of the proxy's faults.");

namespace cserps {
namespace {

std::string Job() {
  return absl::StrCat("name: \"fault-bench\"\nseed: 3\ncluster { servers: \"127.0.0.1:0\" ",
                      "num_workers: ", absl::GetFlag(FLAGS_members),
                      " round_timeout_s: 30 transport: GRPC }\n",
                      "model { kind: FLAT num_params: ", absl::GetFlag(FLAGS_floats), " }\n",
                      "data { batch_size: 1 }\noptimizer { lr: 0.1 }\n",
                      "algorithm { name: \"ssgd\" block_size: 100 }\nepochs: 1\n");
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

absl::Status Run() {
  const std::string job = Job();
  ASSIGN_OR_RETURN(v1::JobConfig config, ParseJobConfig(job, "fault bench"));
  ApplyDefaults(&config);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / absl::StrCat("cserps-bench-faults-", getpid());
  {
    std::ofstream out(path);
    out << job;
  }
  const absl::Cleanup remove_job = [&path] { std::filesystem::remove(path); };
  const std::string program =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "cserps-server").string();
  const uint64_t rounds = absl::GetFlag(FLAGS_rounds);
  std::printf("%d members, %llu floats each, %llu rounds per run, a fresh server each; "
              "faults: reset %.3g, delay %.3g per forwarded piece\n",
              absl::GetFlag(FLAGS_members),
              static_cast<unsigned long long>(config.model().num_params()),
              static_cast<unsigned long long>(rounds), absl::GetFlag(FLAGS_reset),
              absl::GetFlag(FLAGS_delay));
  std::printf("%-7s %9s %8s %8s %8s %7s %7s %7s %8s %9s %9s %8s %8s %8s\n", "path",
              "rounds/s", "p50 ms", "p99 ms", "max ms", "wrong", "failed", "resets", "retries",
              "srv done", "srv fail", "RSS0 MB", "RSS1 MB", "wall s");
  for (const bool faulty : {false, true}) {
    absl::StatusOr<std::unique_ptr<ServerProcesses>> server =
        ServerProcesses::Start(program, path.string(), 1, {"--bulk_port=-1"});
    if (!server.ok()) return server.status();
    const std::string address = (*server)->addresses()[0];
    v1::JobConfig run = config;
    run.mutable_cluster()->set_servers(0, address);
    std::unique_ptr<FaultProxy> proxy;
    if (faulty) {
      absl::StatusOr<std::unique_ptr<FaultProxy>> started = FaultProxy::Start(
          "127.0.0.1", std::stoi(address.substr(address.rfind(':') + 1)),
          {.reset_probability = absl::GetFlag(FLAGS_reset),
           .delay_probability = absl::GetFlag(FLAGS_delay),
           .seed = absl::GetFlag(FLAGS_seed)});
      if (!started.ok()) return started.status();
      proxy = *std::move(started);
      run.mutable_cluster()->set_servers(0, absl::StrCat("127.0.0.1:", proxy->port()));
    }
    ASSIGN_OR_RETURN(ExactRoundsResult result,
                     RunExactRounds(run, {.rounds = rounds,
                                          .server_pid = (*server)->pid(0),
                                          .warm_up = std::max<uint64_t>(1, rounds / 10)}));
    v1::JobConfig direct = config;
    direct.mutable_cluster()->set_servers(0, address);
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                     PsClient::Connect(direct, config.model().num_params()));
    ASSIGN_OR_RETURN(v1::GetStatusResponse status, client->GetStatus(0));
    std::vector<absl::Duration> l = result.latencies;
    std::sort(l.begin(), l.end());
    auto at = [&l](double q) {
      return l.empty() ? 0.0 : Ms(l[static_cast<size_t>(q * static_cast<double>(l.size() - 1))]);
    };
    int failed = 0;
    for (const absl::Status& s : result.failed) {
      if (s.ok()) continue;
      ++failed;
      std::printf("  member failed: %s\n", std::string(s.message()).c_str());
    }
    std::printf("%-7s %9.0f %8.3f %8.3f %8.1f %7llu %7d %7llu %8llu %9llu %9llu %8.1f %8.1f %8.1f\n",
                faulty ? "faulty" : "direct", rounds / absl::ToDoubleSeconds(result.wall), at(0.5),
                at(0.99), at(1.0), static_cast<unsigned long long>(result.wrong_means), failed,
                static_cast<unsigned long long>(proxy != nullptr ? proxy->resets() : 0),
                static_cast<unsigned long long>(result.retries),
                static_cast<unsigned long long>(status.rounds_completed()),
                static_cast<unsigned long long>(status.rounds_failed()),
                result.rss_after_warm_up / 1e6, result.rss_at_end / 1e6,
                absl::ToDoubleSeconds(result.wall));
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace cserps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = cserps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "cserps-bench-faults: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
