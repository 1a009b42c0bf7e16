// cserps-launch: a local cluster on 127.0.0.1 from one job config. Starts
// the S servers (each picks a free port and reports it), then the n workers
// pointed at them; prefixes and streams their output; stops everything when
// one fails or on Ctrl-C (SIGINT, SIGTERM, SIGHUP, SIGQUIT, unless inherited
// as ignored, as under nohup: exit code 128 + the signal's number), each
// process with what it started in its process group; exits non-zero if any
// failed; prints a summary.
// With cluster.local_size L > 1 each worker is a node of L local ranks
// (docs/node_groups.md): one process running L threads (--backend=cpu), or
// L processes, one per GPU (--backend=cuda).
//
// With --nproc=N and a command after "--" the workers are N processes of
// that command (a PyTorch script, docs/torch.md) instead of cserps-workers,
// each given torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME,
// ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID: the job's name) and the job's
// (CSERPS_JOB, CSERPS_SERVERS, CSERPS_SET): as torchrun --nproc_per_node=N
// places them, or with cluster.local_size L > 1 as torchrun --nnodes places
// the job's nodes: process r is local rank r mod L of node r / L.
//
// With --max_restarts=N, a job one of whose processes dies is stopped and
// started again, up to N times: from the newest complete checkpoint of
// checkpoint.dir (docs/reliability.md) when there is one, else from the
// start. Where the running workers can follow (docs/reliability.md: a job
// with checkpoints, flat cserps-workers, an algorithm that rolls back in
// place) a dead server is restarted alone instead, at its address, from the
// newest complete checkpoint, and the workers roll back to it in place. In
// an elastic job that admits ranks back (cluster.admit_every_steps) a dead
// cserps-worker is replaced instead: a new process takes its rank at the
// next admission step. Every restart, of the job or of one process, is one
// of the N.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/algorithm_catalog.h"
#include "common/checkpoint_dir.h"
#include "common/config_load.h"
#include "common/config_override.h"
#include "common/lock_order_checks.h"
#include "tools/cluster/child_process.h"

ABSL_FLAG(std::string, config, "", "Job config file (text-format cserps.v1.JobConfig).");
ABSL_FLAG(std::string, set, "", "Config overrides 'field.path=value', separated by ';'.");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding cserps-server and cserps-worker; default: this "
          "program's own directory.");
ABSL_FLAG(int, startup_timeout_s, 60, "Seconds the servers have to start listening.");
ABSL_FLAG(int, timeout_s, 0, "Stop everything and fail after this many seconds (0 = none).");
ABSL_FLAG(bool, metrics, false,
          "Serve Prometheus metrics from every process on a free 127.0.0.1 port and "
          "keep <output_dir>/prometheus_targets.json (Prometheus file_sd format) "
          "listing them.");
ABSL_FLAG(int, metrics_port_base, 0,
          "With --metrics: server s listens for metrics on 127.0.0.1:BASE+s and worker r "
          "on BASE+S+r (with --backend=cuda and cluster.local_size L > 1, local rank j "
          "of worker r on BASE+S+r*L+j), so Prometheus can be configured before the job "
          "starts; 0 = free ports.");
ABSL_FLAG(std::string, backend, "cpu",
          "The workers' --backend. With cluster.local_size L > 1: cpu starts one "
          "process per node (its L local ranks are threads), cuda starts L per node "
          "(--local_rank 0..L-1, one GPU each).");
ABSL_FLAG(bool, resume, false,
          "Start every process with --resume: the job continues from the newest complete "
          "checkpoint in checkpoint.dir, and fails without one.");
ABSL_FLAG(int, max_restarts, 0,
          "When a server or worker dies, stop the rest and start the whole job again, "
          "at most this many times: every process with --resume from the newest complete "
          "checkpoint (checkpoint.dir), or from the start when there is none yet. Where "
          "the workers can roll back in place (docs/reliability.md), a dead server is "
          "restarted alone from that checkpoint instead; in an elastic job with "
          "cluster.admit_every_steps, a dead worker is replaced instead: the new one "
          "rejoins at the next admission step. Each counts as one of the N.");
ABSL_FLAG(int, nproc, 0,
          "Run the command after \"--\" as the job's workers, this many processes "
          "(cluster.num_workers x cluster.local_size), with torchrun's environment "
          "variables; 0: the workers are cserps-workers.");

namespace {

using cserps::ChildProcess;

constexpr absl::Duration kStopGrace = absl::Seconds(10);
// How long after that SIGKILL an exited process's output is still read: a
// process it started outside its group (setsid) may hold it open for ever.
constexpr absl::Duration kDrainGrace = absl::Seconds(5);

std::string SelfDir() {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : self.parent_path().string();
}

// `program` as execve needs it: a path as given, a bare name found on PATH.
absl::StatusOr<std::string> FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (access(program.c_str(), X_OK) == 0) return program;
    return absl::NotFoundError(
        absl::StrCat("\"", program, "\" cannot be executed: ", std::strerror(errno)));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    if (dir.empty()) continue;
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("\"", program, "\" is not a program on PATH"));
}

// A port of 127.0.0.1 free now, for MASTER_PORT (a script that also joins
// torch.distributed binds it; cserps does not).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// The step of the newest complete checkpoint of the job, every file
// checked as the processes will check them; none without checkpoints.
std::optional<uint64_t> NewestCheckpointStep(const cserps::v1::JobConfig& config) {
  if (config.checkpoint().every_steps() == 0) return std::nullopt;
  const cserps::CheckpointJob job = cserps::CheckpointJob::Of(config);
  std::vector<std::string> passed_over;
  const absl::StatusOr<cserps::LoadedCheckpoint> newest = cserps::LoadNewestCheckpoint(
      job.dir, job.fingerprint, &passed_over, [](const cserps::CheckpointId&) { return false; });
  for (const std::string& reason : passed_over) {
    std::printf("[launch] passed over %s\n", reason.c_str());
  }
  if (!newest.ok()) return std::nullopt;
  return newest->step;
}

// A value of a flat JSON object written by the worker ("key": value).
std::string JsonField(const std::string& json, const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(needle);
  if (at == std::string::npos) return "?";
  const size_t begin = at + needle.size();
  const size_t end = json.find_first_of(",\n}", begin);
  std::string value = json.substr(begin, end - begin);
  if (!value.empty() && value.front() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

// The summary of rank r's local rank j, and the label of its row.
struct SummaryFile {
  std::string label;
  std::string path;
};

std::vector<SummaryFile> SummaryFiles(const cserps::v1::JobConfig& config) {
  const std::filesystem::path dir(config.output_dir());
  const uint32_t local_size = config.cluster().local_size();
  std::vector<SummaryFile> files;
  for (uint32_t r = 0; r < config.cluster().num_workers(); ++r) {
    if (local_size == 1) {
      files.push_back({absl::StrCat(r), (dir / absl::StrCat("worker_", r, ".json")).string()});
      continue;
    }
    for (uint32_t j = 0; j < local_size; ++j) {
      files.push_back({absl::StrCat(r, ".", j),
                       (dir / absl::StrCat("worker_", r, "_", j, ".json")).string()});
    }
  }
  return files;
}

void PrintSummary(const cserps::v1::JobConfig& config) {
  const uint32_t local_size = config.cluster().local_size();
  std::printf("\n== summary: job %s, algorithm %s, %d servers, %d workers",
              config.name().c_str(), config.algorithm().name().c_str(),
              config.cluster().servers_size(), config.cluster().num_workers());
  if (local_size > 1) std::printf(" of %u local ranks", local_size);
  std::printf(" ==\n");
  std::printf("%-6s %10s %10s %10s %10s %12s %12s\n", local_size > 1 ? "rank.j" : "rank",
              "test_acc", "test_loss", "steps", "seconds", "MB_pushed", "MB_pulled");
  for (const SummaryFile& file : SummaryFiles(config)) {
    std::ifstream in(file.path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string json = text.str();
    if (json.empty()) {
      std::printf("%-6s (no summary at %s)\n", file.label.c_str(), file.path.c_str());
      continue;
    }
    double pushed = 0, pulled = 0;
    (void)absl::SimpleAtod(JsonField(json, "bytes_pushed"), &pushed);
    (void)absl::SimpleAtod(JsonField(json, "bytes_pulled"), &pulled);
    std::printf("%-6s %10s %10s %10s %10s %12.1f %12.1f\n", file.label.c_str(),
                JsonField(json, "test_accuracy").c_str(), JsonField(json, "test_loss").c_str(),
                JsonField(json, "steps").c_str(), JsonField(json, "wall_seconds").c_str(),
                pushed / 1e6, pulled / 1e6);
  }
  std::printf("outputs: %s/%s.json and .csv\n", config.output_dir().c_str(),
              local_size > 1 ? "worker_<rank>_<local rank>" : "worker_<rank>");
  std::fflush(stdout);
}

class Cluster {
 public:
  // `command` (its program resolved) empty: the workers are cserps-workers.
  // Everything stops and fails at `deadline` (--timeout_s).
  // `restarts_left`: the restarts --max_restarts leaves, which a dead
  // process restarted alone also takes (a worker of an elastic job that
  // admits ranks back, a server whose workers roll back in place).
  Cluster(cserps::v1::JobConfig config, std::string config_path, std::string overrides,
          std::string bin_dir, std::vector<std::string> command, absl::Time deadline,
          int restart_count, int* restarts_left)
      : config_(std::move(config)),
        config_path_(std::move(config_path)),
        overrides_(std::move(overrides)),
        bin_dir_(std::move(bin_dir)),
        command_(std::move(command)),
        deadline_(deadline),
        restart_count_(restart_count),
        replaces_workers_(config_.cluster().elastic() &&
                          config_.cluster().admit_every_steps() > 0 && command_.empty()),
        restarts_servers_(WorkersRollBackInPlace()),
        restarts_left_(*restarts_left) {}

  // After Run: whether it failed for a reason a restart may cure (a
  // process that died or could not start once the job ran), not a signal
  // or the deadline. The servers' start is not retried: what fails there
  // (a config, a folder holding another run's checkpoints) fails alike
  // again.
  bool restartable() const { return failed() && workers_started_; }
  bool failed_starting() const { return failed() && !workers_started_; }

  bool failed() const { return !succeeded_ && interrupted_by_ == 0 && !timed_out_; }

  int Run(int signal_fd) {
    const int num_servers = config_.cluster().servers_size();
    server_addresses_.resize(num_servers);
    for (int s = 0; s < num_servers; ++s) {
      if (!Spawn(absl::StrCat("server ", s), absl::StrCat(bin_dir_, "/cserps-server"),
                 {absl::StrCat("--shard=", s), "--listen=127.0.0.1:0"}, overrides_)) {
        return Finish();
      }
    }
    const absl::Time start = absl::Now();
    const absl::Time startup_deadline = start + absl::Seconds(absl::GetFlag(FLAGS_startup_timeout_s));
    while (true) {
      Poll(signal_fd);
      const absl::Time now = absl::Now();
      if (!workers_started_ && !stopping_) {
        if (ready_servers_ == num_servers) {
          StartWorkers();
        } else if (now > startup_deadline) {
          Fail(absl::StrCat("servers did not report a listening port within ",
                            absl::GetFlag(FLAGS_startup_timeout_s), " s"));
        }
      }
      if (!stopping_ && now > deadline_) {
        timed_out_ = true;
        Fail(absl::StrCat("--timeout_s=", absl::GetFlag(FLAGS_timeout_s), " reached"));
      }
      CheckChildren();
      if (stopping_ && now > stop_time_ + kStopGrace) {
        for (ChildProcess& c : children_) c.Signal(SIGKILL);
      }
      if (stopping_ && now > stop_time_ + kStopGrace + kDrainGrace) StopReadingExited();
      if (AllDone()) break;
    }
    return Finish();
  }

 private:
  bool Spawn(const std::string& name, const std::string& program,
             std::vector<std::string> args, const std::string& overrides) {
    std::vector<std::string> argv = {program, absl::StrCat("--config=", config_path_)};
    if (!overrides.empty()) argv.push_back(absl::StrCat("--set=", overrides));
    if (absl::GetFlag(FLAGS_metrics)) {
      const int base = absl::GetFlag(FLAGS_metrics_port_base);
      const int port = base == 0 ? 0 : base + MetricsPortOffset(name);
      argv.push_back(absl::StrCat("--metrics_address=127.0.0.1:", port));
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return Start(name, argv, {});
  }

  // The place of process `name` after --metrics_port_base, also when it is
  // restarted alone: "server s", "worker r" or "worker r.j".
  int MetricsPortOffset(const std::string& name) const {
    const size_t space = name.find(' ');
    const size_t dot = name.find('.');
    const int first = std::stoi(name.substr(space + 1));
    if (absl::StartsWith(name, "server ")) return first;
    const int servers = config_.cluster().servers_size();
    if (dot == std::string::npos) return servers + first;
    return servers + first * static_cast<int>(config_.cluster().local_size()) +
           std::stoi(name.substr(dot + 1));
  }

  bool Start(const std::string& name, const std::vector<std::string>& argv,
             std::vector<std::string> env) {
    // One BLAS (and OpenMP) thread per process, since several share this
    // machine's cores, and Python's output line by line, so that a stopped
    // process's last lines are not lost in its buffer; unless the caller
    // set them, as torchrun does.
    for (const char* variable :
         {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1"}) {
      const std::string name(variable, std::strchr(variable, '=') - variable);
      if (std::getenv(name.c_str()) == nullptr) env.push_back(variable);
    }
    absl::StatusOr<ChildProcess> child = ChildProcess::Start(name, argv, env);
    if (!child.ok()) {
      Fail(absl::StrCat("cannot start ", name, ": ", child.status().message()));
      return false;
    }
    std::printf("[launch] %s is pid %d\n", name.c_str(), static_cast<int>(child->pid()));
    std::fflush(stdout);
    children_.push_back(std::move(*child));
    return true;
  }

  // The command's N processes, each with torchrun's variables and the job's.
  void StartCommand() {
    const uint32_t n = config_.cluster().num_workers() * config_.cluster().local_size();
    // Processes per "node": a flat job's are all on this one.
    const uint32_t per_node =
        config_.cluster().local_size() == 1 ? n : config_.cluster().local_size();
    const std::string servers = absl::StrJoin(server_addresses_, ",");
    const int master_port = FreePort();
    if (master_port == 0) {
      return Fail(absl::StrCat("no free port of 127.0.0.1 for MASTER_PORT: ",
                               std::strerror(errno)));
    }
    std::printf("[launch] servers at %s; starting %u processes of %s\n",
                absl::StrJoin(server_addresses_, ", ").c_str(), n, command_[0].c_str());
    std::fflush(stdout);
    std::vector<std::string> common = {
        absl::StrCat("WORLD_SIZE=", n), absl::StrCat("LOCAL_WORLD_SIZE=", per_node),
        "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", master_port),
        absl::StrCat("GROUP_WORLD_SIZE=", n / per_node), "ROLE_NAME=default",
        absl::StrCat("ROLE_WORLD_SIZE=", n),
        absl::StrCat("TORCHELASTIC_RESTART_COUNT=", restart_count_),
        absl::StrCat("TORCHELASTIC_MAX_RESTARTS=", absl::GetFlag(FLAGS_max_restarts)),
        absl::StrCat("TORCHELASTIC_RUN_ID=", config_.name()),
        absl::StrCat("CSERPS_JOB=", std::filesystem::absolute(config_path_).string()),
        absl::StrCat("CSERPS_SERVERS=", servers), absl::StrCat("CSERPS_SET=", overrides_)};
    // The Python package of this build (build/python beside build/bin).
    const std::filesystem::path package = std::filesystem::path(bin_dir_) / ".." / "python";
    if (std::filesystem::exists(package / "cserps")) {
      const char* inherited = std::getenv("PYTHONPATH");
      std::string path = std::filesystem::weakly_canonical(package).string();
      if (inherited != nullptr && inherited[0] != '\0') absl::StrAppend(&path, ":", inherited);
      common.push_back(absl::StrCat("PYTHONPATH=", path));
    }
    for (uint32_t r = 0; r < n; ++r) {
      std::vector<std::string> env = common;
      env.push_back(absl::StrCat("RANK=", r));
      env.push_back(absl::StrCat("ROLE_RANK=", r));
      env.push_back(absl::StrCat("LOCAL_RANK=", r % per_node));
      env.push_back(absl::StrCat("GROUP_RANK=", r / per_node));
      if (!Start(absl::StrCat("worker ", r), command_, env)) return;
      ++workers_;
    }
  }

  void StartWorkers() {
    workers_started_ = true;
    if (!command_.empty()) return StartCommand();
    worker_overrides_ = overrides_;
    if (!worker_overrides_.empty()) worker_overrides_ += ";";
    worker_overrides_ += absl::StrCat("cluster.servers=", absl::StrJoin(server_addresses_, ","));
    const uint32_t local_size = config_.cluster().local_size();
    const std::string backend = absl::GetFlag(FLAGS_backend);
    std::string shape;
    if (local_size > 1) {
      shape = absl::StrCat(" of ", local_size,
                           backend == "cuda" ? " processes (local ranks, one GPU each)"
                                             : " local-rank threads",
                           " each");
    }
    std::printf("[launch] servers at %s; starting %u workers%s\n",
                absl::StrJoin(server_addresses_, ", ").c_str(),
                config_.cluster().num_workers(), shape.c_str());
    std::fflush(stdout);
    const std::string backend_flag = absl::StrCat("--backend=", backend);
    for (uint32_t r = 0; r < config_.cluster().num_workers(); ++r) {
      if (backend != "cuda" || local_size == 1) {
        if (!SpawnWorker(r)) return;
        ++workers_;
        continue;
      }
      for (uint32_t j = 0; j < local_size; ++j) {
        if (!Spawn(absl::StrCat("worker ", r, ".", j), absl::StrCat(bin_dir_, "/cserps-worker"),
                   {absl::StrCat("--rank=", r), backend_flag, absl::StrCat("--local_rank=", j)},
                   worker_overrides_)) {
          return;
        }
        ++workers_;
      }
    }
  }

  // The cserps-worker of rank `rank` of a flat job (one process per rank).
  bool SpawnWorker(uint32_t rank) {
    return Spawn(absl::StrCat("worker ", rank), absl::StrCat(bin_dir_, "/cserps-worker"),
                 {absl::StrCat("--rank=", rank),
                  absl::StrCat("--backend=", absl::GetFlag(FLAGS_backend))},
                 worker_overrides_);
  }

  // Whether the running workers follow a server restarted from a checkpoint
  // (Trainer::RollBackIfAShardRestarted).
  bool WorkersRollBackInPlace() const {
    const absl::StatusOr<cserps::AlgorithmInfo> algorithm =
        cserps::FindAlgorithm(config_.algorithm().name());
    return command_.empty() && config_.cluster().local_size() == 1 &&
           config_.checkpoint().every_steps() > 0 && !config_.checkpoint().dir().empty() &&
           algorithm.ok() && algorithm->rolls_back_in_place();
  }

  // Worker processes of the job: one per node, or one per local rank with
  // --backend=cuda or a command.
  uint32_t ExpectedWorkerProcesses() const {
    const uint32_t nodes = config_.cluster().num_workers();
    return absl::GetFlag(FLAGS_backend) == "cuda" || !command_.empty()
               ? nodes * config_.cluster().local_size()
               : nodes;
  }

  void Poll(int signal_fd) {
    std::vector<pollfd> fds = {{signal_fd, POLLIN, 0}};
    std::vector<size_t> owner;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].output_fd() >= 0) {
        fds.push_back({children_[i].output_fd(), POLLIN, 0});
        owner.push_back(i);
      }
    }
    if (poll(fds.data(), fds.size(), 200) <= 0) return;
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo != SIGCHLD) {
          if (interrupted_by_ == 0) interrupted_by_ = static_cast<int>(info.ssi_signo);
          Fail(absl::StrCat("signal ", info.ssi_signo, " (", strsignal(info.ssi_signo),
                            "): stopping the cluster"));
        }
      }
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      ChildProcess& child = children_[owner[k - 1]];
      for (const std::string& line : child.ReadLines()) {
        std::printf("[%s] %s\n", child.name().c_str(), line.c_str());
        const std::string marker = "listening on ";
        const size_t at = line.find(marker);
        if (absl::StartsWith(child.name(), "server ") &&
            absl::StartsWith(line, "cserps-server shard ") && at != std::string::npos) {
          const int shard = std::stoi(child.name().substr(7));
          if (server_addresses_[shard].empty()) ++ready_servers_;
          server_addresses_[shard] = line.substr(at + marker.size());
        }
        const std::string metrics = "metrics on http://";
        if (absl::StartsWith(line, metrics)) {
          const std::string address = line.substr(
              metrics.size(), line.find('/', metrics.size()) - metrics.size());
          metrics_targets_[child.name()] = address;
          WriteMetricsTargets();
        }
      }
      std::fflush(stdout);
    }
  }

  // Prometheus file-based service discovery: one target group per process,
  // labelled with its role and index (server 0 → role="server", index="0").
  void WriteMetricsTargets() const {
    std::vector<std::string> groups;
    for (const auto& [name, address] : metrics_targets_) {
      const size_t space = name.find(' ');
      groups.push_back(absl::StrCat("  {\"targets\": [\"", address,
                                    "\"], \"labels\": {\"role\": \"", name.substr(0, space),
                                    "\", \"index\": \"", name.substr(space + 1), "\"}}"));
    }
    const std::filesystem::path dir(config_.output_dir());
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    const std::filesystem::path path = dir / "prometheus_targets.json";
    const std::filesystem::path tmp = dir / "prometheus_targets.json.tmp";
    {
      std::ofstream out(tmp);
      out << "[\n" << absl::StrJoin(groups, ",\n") << "\n]\n";
    }
    // Prometheus may read the file at any time: replace it atomically.
    std::filesystem::rename(tmp, path, error);
  }

  void CheckChildren() {
    int wait_status = 0;
    pid_t pid;
    // Started after the loop, which holds children_: ranks, and shards.
    std::vector<std::pair<uint32_t, int>> replace;  // with the exit code
    std::vector<std::pair<uint32_t, int>> restart_servers;
    while ((pid = waitpid(-1, &wait_status, WNOHANG)) > 0) {
      for (ChildProcess& c : children_) {
        if (c.pid() != pid) continue;
        c.SetExited(wait_status);
        const bool is_worker = absl::StartsWith(c.name(), "worker ");
        if (is_worker && *c.exit_code() != 0 && !stopping_ && replaces_workers_ &&
            restarts_left_ > 0) {
          // Its replacement takes its place among the workers_.
          --restarts_left_;
          replace.emplace_back(static_cast<uint32_t>(std::stoul(c.name().substr(7))),
                               *c.exit_code());
        } else if (is_worker && *c.exit_code() != 0 && !stopping_ &&
                   config_.cluster().elastic() && workers_lost_ + 1 < ExpectedWorkerProcesses()) {
          // The servers drop it at its rounds' timeout; the others go on.
          ++workers_lost_;
          std::printf("[launch] %s exited with code %d; the elastic job goes on without it\n",
                      c.name().c_str(), *c.exit_code());
          std::fflush(stdout);
        } else if (!is_worker && !stopping_ && workers_started_ && restarts_servers_ &&
                   restarts_left_ > 0 && NewestCheckpointStep(config_).has_value()) {
          --restarts_left_;
          restart_servers.emplace_back(static_cast<uint32_t>(std::stoul(c.name().substr(7))),
                                       *c.exit_code());
        } else if (*c.exit_code() != 0 && !stopping_) {
          Fail(absl::StrCat(c.name(), " exited with code ", *c.exit_code()));
        } else if (!is_worker && !stopping_) {
          Fail(absl::StrCat(c.name(), " exited while the job was running"));
        } else if (is_worker && *c.exit_code() == 0) {
          ++workers_done_;
        }
      }
    }
    if (stopping_) {
      // A process reaped after them in this pass stopped the cluster: their
      // restarts are not taken, and may restart the whole job.
      restarts_left_ += static_cast<int>(replace.size() + restart_servers.size());
      return;
    }
    // A start that fails stops the cluster: the restarts not started are
    // given back.
    int not_started = static_cast<int>(replace.size() + restart_servers.size());
    for (const auto& [rank, code] : replace) {
      ++replaced_;
      std::printf("[launch] worker %u exited with code %d; starting a replacement (%d so far), "
                  "which rejoins the elastic job at its next admission step\n",
                  rank, code, replaced_);
      std::fflush(stdout);
      if (!SpawnWorker(rank)) {
        restarts_left_ += not_started;
        return;
      }
      --not_started;
    }
    for (const auto& [shard, code] : restart_servers) {
      std::printf("[launch] server %u exited with code %d; restarting it alone at %s from the "
                  "checkpoint of step %llu: the workers roll back to it in place\n",
                  shard, code, server_addresses_[shard].c_str(),
                  static_cast<unsigned long long>(NewestCheckpointStep(config_).value_or(0)));
      std::fflush(stdout);
      std::string resume = overrides_;
      absl::StrAppend(&resume, resume.empty() ? "" : ";", "checkpoint.resume=true");
      if (!Spawn(absl::StrCat("server ", shard), absl::StrCat(bin_dir_, "/cserps-server"),
                 {absl::StrCat("--shard=", shard),
                  absl::StrCat("--listen=", server_addresses_[shard])},
                 resume)) {
        restarts_left_ += not_started;
        return;
      }
      --not_started;
    }
    if (!stopping_ && workers_started_ && workers_done_ + workers_lost_ == workers_ &&
        workers_ == ExpectedWorkerProcesses()) {
      succeeded_ = true;
      StopAll();
    }
  }

  void Fail(const std::string& why) {
    if (stopping_) return;
    failure_ = why;
    std::printf("[launch] %s\n", why.c_str());
    std::fflush(stdout);
    StopAll();
  }

  void StopAll() {
    stopping_ = true;
    stop_time_ = absl::Now();
    for (ChildProcess& c : children_) c.Signal(SIGTERM);
  }

  void StopReadingExited() {
    for (ChildProcess& c : children_) {
      if (c.running() || c.output_fd() < 0) continue;
      for (const std::string& line : c.CloseOutput()) {
        std::printf("[%s] %s\n", c.name().c_str(), line.c_str());
      }
      std::printf("[launch] %s exited, but a process outside its process group still holds its "
                  "output: no longer reading it\n",
                  c.name().c_str());
      std::fflush(stdout);
    }
  }

  // Also waits for what the children left in their groups (stopped with
  // them).
  bool AllDone() {
    for (ChildProcess& c : children_) {
      if (c.running() || c.output_fd() >= 0 || c.GroupLives()) return false;
    }
    return stopping_;
  }

  int Finish() {
    for (ChildProcess& c : children_) {
      c.Signal(SIGKILL);
      if (c.running()) {
        int status = 0;
        waitpid(c.pid(), &status, 0);
        c.SetExited(status);
      }
    }
    if (succeeded_) {
      if (command_.empty()) {
        PrintSummary(config_);
      } else {
        std::printf("[launch] %u processes of %s finished\n", workers_, command_[0].c_str());
      }
      return 0;
    }
    std::printf("[launch] failed: %s\n", failure_.c_str());
    // As a shell reports a process its signal ended.
    return interrupted_by_ != 0 ? 128 + interrupted_by_ : 1;
  }

  const cserps::v1::JobConfig config_;
  const std::string config_path_;
  const std::string overrides_;
  const std::string bin_dir_;
  const std::vector<std::string> command_;
  const absl::Time deadline_;
  const int restart_count_;  // whole-job restarts before this run
  std::vector<ChildProcess> children_;
  std::vector<std::string> server_addresses_;
  std::map<std::string, std::string> metrics_targets_;  // process name -> host:port
  int ready_servers_ = 0;
  bool workers_started_ = false;
  uint32_t workers_ = 0;
  uint32_t workers_done_ = 0;
  uint32_t workers_lost_ = 0;  // elastic: workers that died while the others went on
  // In-place restarts: of dead workers (replaced) and of dead servers, while
  // restarts_left_ lasts.
  const bool replaces_workers_;
  const bool restarts_servers_;
  int& restarts_left_;
  int replaced_ = 0;
  std::string worker_overrides_;  // the workers' --set: the job's and the servers'
  bool stopping_ = false;
  bool succeeded_ = false;
  int interrupted_by_ = 0;  // the first signal that stopped the cluster
  bool timed_out_ = false;
  absl::Time stop_time_;
  std::string failure_;
};

}  // namespace

int main(int argc, char** argv) {
  cserps::SkipLockOrderChecksWithNdebug();
  absl::SetProgramUsageMessage(
      "cserps-launch --config=configs/quickstart.textproto [--set='field=value;...']\n"
      "  cserps-launch --config=JOB --nproc=N [--set=...] -- python3 script.py [ARGS...]");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (std::optional<std::string> all = cserps::RepeatedSetFlags(argc, argv)) {
    absl::SetFlag(&FLAGS_set, *all);
  }
  std::vector<std::string> command(positional.begin() + 1, positional.end());
  sigset_t mask;
  sigemptyset(&mask);
  // Each stops the cluster, as Ctrl-C does: the children are in process
  // groups of their own, and die with the launcher only by SIGTERM.
  // One inherited as ignored stays so (nohup, a background job of a
  // script): the kernel queues a blocked signal even when it is ignored.
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    struct sigaction inherited = {};
    if (sigaction(signo, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN) continue;
    sigaddset(&mask, signo);
  }
  // Ignored, SIGCHLD would have the kernel reap the children unasked, and
  // waitpid would never report them.
  signal(SIGCHLD, SIG_DFL);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  // A closed reader of the launcher's output is not a reason to leave the
  // cluster running.
  signal(SIGPIPE, SIG_IGN);
  const int signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);

  const std::string path = absl::GetFlag(FLAGS_config);
  const std::string overrides = absl::GetFlag(FLAGS_set);
  absl::StatusOr<cserps::v1::JobConfig> config = cserps::LoadJobWithOverrides(
      path, cserps::SplitOverrides(overrides), {.allow_port_zero = true});
  if (!config.ok()) {
    std::fprintf(stderr, "cserps-launch: %s\n", config.status().ToString().c_str());
    return 2;
  }
  std::printf("[launch] job %s: %s\n", config->name().c_str(),
              cserps::DescribeAlgorithm(config->algorithm()).c_str());
  if (const std::string backend = absl::GetFlag(FLAGS_backend);
      backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "cserps-launch: --backend: unknown backend \"%s\"; known: cpu, cuda\n",
                 backend.c_str());
    return 2;
  }
  const int nproc = absl::GetFlag(FLAGS_nproc);
  if (nproc != 0 || !command.empty()) {
    std::string problem;
    if (command.empty()) {
      problem = "--nproc needs the workers' command after \"--\"";
    } else if (nproc < 1) {
      problem = absl::StrCat("a command after \"--\" needs --nproc >= 1 (got ", nproc, ")");
    } else if (const uint32_t processes =
                   config->cluster().num_workers() * config->cluster().local_size();
               static_cast<uint32_t>(nproc) != processes) {
      problem = absl::StrCat("--nproc=", nproc, " but the job has cluster.num_workers ",
                             config->cluster().num_workers(), " x cluster.local_size ",
                             config->cluster().local_size(), " = ", processes,
                             " processes: give that number");
    }
    if (problem.empty()) {
      absl::StatusOr<std::string> program = FindProgram(command[0]);
      if (program.ok()) {
        command[0] = *program;
      } else {
        problem = std::string(program.status().message());
      }
    }
    if (!problem.empty()) {
      std::fprintf(stderr, "cserps-launch: %s\n", problem.c_str());
      return 2;
    }
  }
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = SelfDir();
  const int max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (max_restarts < 0) {
    std::fprintf(stderr, "cserps-launch: --max_restarts must be >= 0 (got %d)\n", max_restarts);
    return 2;
  }
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const absl::Time deadline =
      timeout_s > 0 ? absl::Now() + absl::Seconds(timeout_s) : absl::InfiniteFuture();
  if (absl::GetFlag(FLAGS_resume)) {
    const std::optional<uint64_t> step = NewestCheckpointStep(*config);
    if (!step.has_value()) {
      std::fprintf(stderr,
                   "cserps-launch: --resume: no complete checkpoint of this job in "
                   "checkpoint.dir \"%s\"%s\n",
                   config->checkpoint().dir().c_str(),
                   config->checkpoint().every_steps() == 0 ? " (checkpoint.every_steps is 0)" : "");
      return 2;
    }
    std::printf("[launch] resuming from the checkpoint of step %llu\n",
                static_cast<unsigned long long>(*step));
  }
  std::string resume_overrides = overrides;
  absl::StrAppend(&resume_overrides, resume_overrides.empty() ? "" : ";", "checkpoint.resume=true");
  std::string attempt_overrides = absl::GetFlag(FLAGS_resume) ? resume_overrides : overrides;
  int restarts_left = max_restarts;
  int restart_count = 0;  // of the whole job, as torchrun counts them
  while (true) {
    Cluster cluster(*config, path, attempt_overrides, bin_dir, command, deadline,
                    restart_count, &restarts_left);
    const int code = cluster.Run(signal_fd);
    if (cluster.failed_starting() && restarts_left > 0) {
      std::printf("[launch] not restarted: the servers failed before the workers started, "
                  "and would again\n");
    }
    if (code == 0 || !cluster.restartable() || restarts_left == 0) return code;
    --restarts_left;
    ++restart_count;
    const std::optional<uint64_t> step = NewestCheckpointStep(*config);
    std::printf("[launch] restart %d of %d: %s\n", max_restarts - restarts_left, max_restarts,
                step.has_value() ? absl::StrCat("resuming from the checkpoint of step ", *step).c_str()
                                 : "no complete checkpoint yet, starting from step 0");
    std::fflush(stdout);
    attempt_overrides = step.has_value() ? resume_overrides : overrides;
  }
}
