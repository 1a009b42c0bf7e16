// cserps-server: one shard of the parameter server.
#include <malloc.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/notification.h"
#include "common/config_load.h"
#include "common/config_override.h"
#include "common/lock_order_checks.h"
#include "common/metrics.h"
#include "common/open_file_limit.h"
#include "common/signals.h"
#include "common/start_flags.h"
#include "common/transport_security.h"
#include "server/ps_server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "Job config file (text-format cserps.v1.JobConfig).");
ABSL_FLAG(std::string, set, "",
          "Config overrides 'field.path=value', separated by ';' "
          "(e.g. --set='optimizer.lr=0.05;model.hidden=256,128').");
ABSL_FLAG(int, shard, 0, "Shard index of this server (0-based).");
ABSL_FLAG(std::string, listen, "",
          "Address to listen on; default: cluster.servers[shard] from the "
          "config. Port 0 picks a free port.");
ABSL_FLAG(int, bulk_port, 0,
          "Port of the bulk transport for PushPull rounds (docs/protocol.md 17), on "
          "the --listen host; 0 picks a free port, -1 turns it off (workers then "
          "use gRPC). Register tells workers the port, so a published port must "
          "be the same number as the container's.");
ABSL_FLAG(bool, insecure, false,
          "Listen on a non-loopback address without TLS or a token (security { ... }): only "
          "on a network where everyone who can reach the port may train the job.");
ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics on http://ADDRESS/metrics (host:port; port 0 "
          "picks a free port); empty: no metrics.");

int main(int argc, char** argv) {
  cserps::SkipLockOrderChecksWithNdebug();
  absl::SetProgramUsageMessage(
      "cserps-server --config=job.textproto --shard=S [--listen=host:port]");
  absl::ParseCommandLine(argc, argv);
  if (std::optional<std::string> all = cserps::RepeatedSetFlags(argc, argv)) {
    absl::SetFlag(&FLAGS_set, *all);
  }
  // Every round allocates its sum and mean (a chunk: 1 MiB by default, its
  // sum twice that) and frees them a few steps later. glibc hands blocks
  // this large back to the kernel (unmapped, or trimmed off the heap's top),
  // so each round paid page faults on fresh memory; kept in the heap they
  // are reused (docs/decisions.md has the figures).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // Lives as long as the signal thread, which is never joined; held by a
  // static, so a leak check at exit finds it reachable.
  static absl::Notification* const stop = new absl::Notification();
  cserps::CallOnTerminationSignal([](int signo) {
    spdlog::info("signal {}: shutting down", signo);
    stop->Notify();
  });

  absl::StatusOr<cserps::v1::JobConfig> config = cserps::LoadJobWithOverrides(
      absl::GetFlag(FLAGS_config),
      cserps::WithStartFlags(cserps::SplitOverrides(absl::GetFlag(FLAGS_set))),
      {.allow_port_zero = true});
  if (!config.ok()) {
    spdlog::error("{}", config.status().ToString());
    return 2;
  }
  const int shard = absl::GetFlag(FLAGS_shard);
  if (shard < 0 || shard >= config->cluster().servers_size()) {
    spdlog::error("--shard={} is out of range: cluster.servers lists {} servers",
                  shard, config->cluster().servers_size());
    return 2;
  }
  std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.empty()) listen = config->cluster().servers(shard);
  if (absl::Status exposed =
          cserps::CheckExposure(listen, config->security(), absl::GetFlag(FLAGS_insecure));
      !exposed.ok()) {
    spdlog::error("{}", exposed.ToString());
    return 2;
  }
  if (absl::GetFlag(FLAGS_insecure) && !cserps::IsLoopbackAddress(listen)) {
    spdlog::warn("--insecure: listening on {} whatever config.security holds", listen);
  }

  if (absl::StatusOr<uint64_t> files = cserps::RaiseOpenFileLimit(); files.ok()) {
    spdlog::info("open-file limit {} (a connection holds one)", *files);
  } else {
    spdlog::warn("{}", files.status().ToString());
  }

  // Declared before the server, which exports to it until destroyed.
  std::unique_ptr<cserps::MetricsRegistry> metrics;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_address);
      !address.empty()) {
    absl::StatusOr<std::unique_ptr<cserps::MetricsRegistry>> started =
        cserps::MetricsRegistry::Start(address);
    if (!started.ok()) {
      spdlog::error("--metrics_address: {}", started.status().ToString());
      return 2;
    }
    metrics = *std::move(started);
    std::printf("metrics on http://%s/metrics\n", metrics->address().c_str());
    std::fflush(stdout);
  }
  absl::StatusOr<std::unique_ptr<cserps::PsServer>> server =
      cserps::PsServer::Start(*config, shard, listen, {}, metrics.get(),
                              absl::GetFlag(FLAGS_bulk_port));
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  const cserps::BlockLayout& layout = (*server)->service().layout();
  spdlog::info("shard {}/{}: blocks [{}, {}), floats [{}, {}) of {}; {} workers; fingerprint {:016x}",
               shard, layout.num_shards(), layout.ShardFirstBlock(shard),
               layout.ShardEndBlock(shard), layout.ShardFirstFloat(shard),
               layout.ShardEndFloat(shard), layout.num_params(),
               config->cluster().num_workers(), (*server)->service().fingerprint());
  // The launcher reads this line to learn the port.
  std::printf("cserps-server shard %d listening on %s\n", shard,
              (*server)->address().c_str());
  if ((*server)->bulk_port() != 0) {
    spdlog::info("shard {}: bulk transport on port {}", shard, (*server)->bulk_port());
  }
  std::fflush(stdout);

  // A failed round means a process of the job died: the job goes on only
  // by restarting from its checkpoint, which the restart policy does.
  const bool restart_on_failure = config->checkpoint().restart_on_failure();
  while (!stop->WaitForNotificationWithTimeout(absl::Seconds(1))) {
    if ((*server)->roll_back_failed()) {
      spdlog::error("shard {}: its roll back failed and it serves no more rounds; exiting with "
                    "code 3 for the restart policy to restart the job from its newest "
                    "checkpoint", shard);
      (*server)->Shutdown();
      return 3;
    }
    if (restart_on_failure && (*server)->rounds_failed() > 0) {
      spdlog::error("shard {}: a round failed (a process of the job died); exiting with code 3 "
                    "for the restart policy to restart the job from its newest checkpoint",
                    shard);
      (*server)->Shutdown();
      return 3;
    }
  }
  (*server)->Shutdown();
  spdlog::info("shard {} stopped", shard);
  return 0;
}
