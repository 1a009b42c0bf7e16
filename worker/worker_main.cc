// cserps-worker: one training process of a job, or with cluster.local_size
// L > 1 one node: its L local ranks as threads of this process (CPU), or
// this process as one of them (one process per GPU, --local_rank).
// docs/node_groups.md says how to run each.
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/algorithm_catalog.h"
#include "common/config_load.h"
#include "common/config_override.h"
#include "common/lock_order_checks.h"
#include "common/metrics.h"
#include "common/model_spec.h"
#include "common/start_flags.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/data/dataset.h"
#include "worker/group/local_group.h"
#include "worker/group/thread_group.h"
#include "worker/ps/node_client.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/worker_id.h"
#include "worker/trainer/trainer.h"
#ifdef CSERPS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/kernels/cuda_status.h"
#endif
#ifdef CSERPS_HAVE_NCCL
#include "worker/cuda/nccl_group.h"
#endif

ABSL_FLAG(std::string, config, "", "Job config file (text-format cserps.v1.JobConfig).");
ABSL_FLAG(std::string, set, "",
          "Config overrides 'field.path=value', separated by ';' "
          "(e.g. --set='optimizer.lr=0.05;cluster.servers=10.0.0.5:7000,10.0.0.6:7000').");
ABSL_FLAG(int, rank, -1,
          "Rank to claim (the node's, with cluster.local_size > 1); -1 lets shard 0 "
          "assign the lowest free rank.");
ABSL_FLAG(std::string, worker_id, "",
          "Identity across retries of Register (the node's, shared by its local "
          "ranks); default host:pid:nonce, or with --backend=cuda and "
          "cluster.local_size > 1 the host name (plus :rank<R> with --rank), which "
          "every process of the node computes alike.");
ABSL_FLAG(int, blas_threads, 1,
          "OpenBLAS threads of this process. Keep 1 when several workers share "
          "a machine; 0 leaves OpenBLAS's default (one per core).");

ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics on http://ADDRESS/metrics (host:port; port 0 "
          "picks a free port); empty: no metrics. With local ranks as threads, "
          "local rank 0's.");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu: OpenBLAS; with cluster.local_size L > 1 this process runs the "
          "node's L local ranks as threads. cuda: the CUDA model on GPU "
          "--local_rank, with the model and the algorithm's state on the device; "
          "with L > 1 one process per GPU, the node's local ranks joined by NCCL "
          "(docs/gpu.md). Not part of the job config: nodes may differ.");
ABSL_FLAG(int, local_rank, -1,
          "This process's local rank in its node (--backend=cuda; with "
          "cluster.local_size 1 it only picks the GPU). -1: the LOCAL_RANK "
          "environment variable (as torchrun sets it), else not set.");
ABSL_FLAG(std::string, group_dir, "",
          "Node-local directory where local rank 0 publishes the NCCL id for the "
          "others (--backend=cuda, cluster.local_size > 1); default "
          "/dev/shm/cserps-<job name>-<worker id>.");

namespace {

// --local_rank, else LOCAL_RANK, else -1.
absl::StatusOr<int> LocalRankFlag() {
  const int flag = absl::GetFlag(FLAGS_local_rank);
  if (flag >= 0) return flag;
  if (flag != -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local_rank: must be >= 0, or -1 for not set (got ", flag, ")"));
  }
  const char* env = std::getenv("LOCAL_RANK");
  if (env == nullptr || env[0] == '\0') return -1;
  int value = -1;
  if (!absl::SimpleAtoi(env, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LOCAL_RANK=\"", env, "\" is not a local rank (an integer >= 0)"));
  }
  return value;
}

// Everything a process needs to train, loaded once (threads share it).
struct Job {
  cserps::v1::JobConfig config;
  cserps::ModelSpec spec;
  cserps::Dataset train;
  cserps::Dataset test;
  std::unique_ptr<cserps::MetricsRegistry> metrics;  // null: no metrics
};

absl::StatusOr<std::unique_ptr<cserps::MetricsRegistry>> StartMetrics() {
  const std::string address = absl::GetFlag(FLAGS_metrics_address);
  if (address.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<cserps::MetricsRegistry>> started =
      cserps::MetricsRegistry::Start(address);
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("--metrics_address: ", started.status().message()));
  }
  std::printf("metrics on http://%s/metrics\n", (*started)->address().c_str());
  std::fflush(stdout);
  return started;
}

// Connects and registers the client of a flat worker (every shard).
absl::StatusOr<std::unique_ptr<cserps::PsClient>> ConnectFlat(const Job& job,
                                                              const std::string& worker_id) {
  const cserps::v1::JobConfig& config = job.config;
  ASSIGN_OR_RETURN(std::unique_ptr<cserps::PsClient> client,
                   cserps::PsClient::Connect(config, job.spec.num_params));
  ASSIGN_OR_RETURN(const uint32_t rank,
                   client->Register(absl::GetFlag(FLAGS_rank), worker_id));
  spdlog::info("rank {}/{}: {} parameters, {} training and {} test examples, algorithm {}",
               rank, config.cluster().num_workers(), job.spec.num_params, job.train.size,
               job.test.size, cserps::DescribeAlgorithm(config.algorithm()));
  return client;
}

// The backend of one process's trainer; null: the CPU model on host memory.
using MakeBackend = std::function<absl::StatusOr<std::unique_ptr<cserps::DeviceBackend>>()>;

// Registers, trains and writes the summary of one process of the job: flat
// (group null) or one local rank of a node. `metrics` null: none.
absl::Status TrainProcess(const Job& job, cserps::LocalGroup* group,
                          const std::string& worker_id, cserps::MetricsRegistry* metrics,
                          const MakeBackend& make_backend) {
  const cserps::v1::JobConfig& config = job.config;
  cserps::PsClientOptions options;
  if (group != nullptr) {
    options.shard_stride = group->size();
    options.shard_offset = group->local_rank();
  }
  const int requested_rank = absl::GetFlag(FLAGS_rank);
  std::unique_ptr<cserps::PsClient> client;
  uint32_t rank = 0;
  if (group == nullptr) {
    ASSIGN_OR_RETURN(client, ConnectFlat(job, worker_id));
    rank = client->rank();
  } else {
    ASSIGN_OR_RETURN(client, cserps::PsClient::Connect(config, job.spec.num_params, options));
    ASSIGN_OR_RETURN(rank, cserps::RegisterNode(*group, *client, requested_rank, worker_id));
    spdlog::info("rank {}/{} local rank {}/{} (shards {} mod {}): {} parameters, {} training "
                 "and {} test examples, algorithm {}",
                 rank, config.cluster().num_workers(), group->local_rank(), group->size(),
                 group->local_rank(), group->size(), job.spec.num_params, job.train.size,
                 job.test.size, cserps::DescribeAlgorithm(config.algorithm()));
  }
  // Declared before the trainer, which updates them until destroyed.
  std::unique_ptr<cserps::WorkerMetrics> worker_metrics;
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(worker_metrics, cserps::WorkerMetrics::Create(
                                         metrics, rank, config.algorithm().name()));
  }
  std::unique_ptr<cserps::DeviceBackend> backend;
  if (make_backend) {
    ASSIGN_OR_RETURN(backend, make_backend());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<cserps::Trainer> trainer,
                   cserps::Trainer::Create(config, {client.get(), group}, &job.train,
                                           &job.test, worker_metrics.get(),
                                           std::move(backend)));
  return trainer->Run();
}

// TrainProcess, with a local rank's errors naming it.
absl::Status Train(const Job& job, cserps::LocalGroup* group, const std::string& worker_id,
                   cserps::MetricsRegistry* metrics, const MakeBackend& make_backend) {
  const absl::Status status = TrainProcess(job, group, worker_id, metrics, make_backend);
  if (status.ok() || group == nullptr) return status;
  return absl::Status(status.code(), absl::StrCat("local rank ", group->local_rank(), ": ",
                                                  status.message()));
}

// Logs `status` and ends the process at once: the other local ranks would
// otherwise wait in a collective for the failed one until the group's
// timeout, and they still use this process's state, so nothing can be
// unwound underneath them.
[[noreturn]] void ExitWhileLocalRanksRun(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  spdlog::error("stopping the other local ranks of this node");
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::_Exit(1);
}

// The outcome of the local-rank threads, as they finish.
class LocalRankResults {
 public:
  explicit LocalRankResults(uint32_t size) : size_(size) {}

  void Finished(absl::Status status) {
    absl::MutexLock lock(&mu_);
    ++finished_;
    if (!status.ok() && failure_.ok()) failure_ = std::move(status);
  }

  // Blocks until every thread has finished or one has failed; returns the
  // first failure and whether every thread has finished.
  std::pair<absl::Status, bool> AwaitAllOrFailure() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &LocalRankResults::AllOrFailure));
    return {failure_, finished_ == size_};
  }

 private:
  bool AllOrFailure() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ == size_ || !failure_.ok();
  }

  const uint32_t size_;
  absl::Mutex mu_;
  uint32_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// A GPU-less node: its L local ranks as threads of this process, joined by
// a ThreadGroup. Local rank 0 alone serves metrics.
absl::Status RunLocalRankThreads(const Job& job, const std::string& node_id) {
  const uint32_t size = job.config.cluster().local_size();
  cserps::ThreadGroupOptions group_options;
  group_options.timeout = cserps::NodeGroupTimeout(job.config, cserps::PsClientOptions{});
  std::vector<std::unique_ptr<cserps::ThreadGroup>> members =
      cserps::ThreadGroup::Create(size, group_options);
  LocalRankResults results(size);
  std::vector<std::thread> threads;
  for (uint32_t j = 0; j < size; ++j) {
    try {
      threads.emplace_back([&job, &node_id, &members, &results, j] {
        results.Finished(Train(job, members[j].get(), node_id,
                               j == 0 ? job.metrics.get() : nullptr, nullptr));
      });
    } catch (const std::system_error& e) {
      ExitWhileLocalRanksRun(absl::ResourceExhaustedError(absl::StrCat(
          "no thread for local rank ", j, " of cluster.local_size ", size,
          " (the CPU backend runs one thread per local rank): ", e.what())));
    }
  }
  const auto [failure, all_finished] = results.AwaitAllOrFailure();
  if (!all_finished) ExitWhileLocalRanksRun(failure);
  for (std::thread& t : threads) t.join();
  return failure;
}

absl::Status RunWorker() {
  Job job;
  ASSIGN_OR_RETURN(job.config,
                   cserps::LoadJobWithOverrides(
                       absl::GetFlag(FLAGS_config),
                       cserps::WithStartFlags(cserps::SplitOverrides(absl::GetFlag(FLAGS_set)))));
  const cserps::v1::JobConfig& config = job.config;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: unknown backend \"", backend, "\"; known: cpu, cuda"));
  }
  ASSIGN_OR_RETURN(const int local_rank, LocalRankFlag());
  const uint32_t local_size = config.cluster().local_size();
  if (local_size > 1 && local_rank >= static_cast<int>(local_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--local_rank (or LOCAL_RANK) is ", local_rank,
        " but cluster.local_size is ", local_size));
  }
  if (backend == "cpu" && local_size > 1 && local_rank >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--local_rank (or LOCAL_RANK) is ", local_rank, " with --backend=cpu: a CPU "
        "node runs its ", local_size, " local ranks (cluster.local_size) as threads of "
        "one process; start one process per node without --local_rank (unset "
        "LOCAL_RANK), or use --backend=cuda for one process per GPU"));
  }
  if (backend == "cuda" && local_size > 1 && local_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend=cuda with cluster.local_size ", local_size,
        " runs one process per GPU: give each its --local_rank (or LOCAL_RANK, as "
        "torchrun sets it) in [0, ", local_size, ")"));
  }
#ifndef CSERPS_HAVE_CUDA
  if (backend == "cuda") {
    return absl::FailedPreconditionError(
        "--backend=cuda: this cserps-worker was built without CUDA (configure with "
        "-DCSERPS_CUDA=ON where nvcc is installed)");
  }
#else
  if (backend == "cuda" && cserps::CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "--backend=cuda: no CUDA device is visible to this process");
  }
#endif

  ASSIGN_OR_RETURN(job.spec, cserps::MakeModelSpec(config.model()));
  ASSIGN_OR_RETURN(job.train,
                   cserps::LoadMnistSplit(config.data().dir(), cserps::Split::kTrain,
                                          config.data().train_limit()));
  ASSIGN_OR_RETURN(job.test,
                   cserps::LoadMnistSplit(config.data().dir(), cserps::Split::kTest,
                                          config.data().test_limit()));
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) {
    worker_id = backend == "cuda" && local_size > 1
                    ? cserps::DefaultNodeId(absl::GetFlag(FLAGS_rank))
                    : cserps::DefaultWorkerId();
  }
  ASSIGN_OR_RETURN(job.metrics, StartMetrics());

  if (backend == "cpu") {
    if (local_size == 1) return Train(job, nullptr, worker_id, job.metrics.get(), nullptr);
    return RunLocalRankThreads(job, worker_id);
  }
#ifdef CSERPS_HAVE_CUDA
  // One process per GPU: device = local rank (0 when not set).
  const int device = std::max(local_rank, 0);
  CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  // A node's NcclGroup is both its LocalGroup and, for the backend, its
  // collectives on the device.
  std::unique_ptr<cserps::LocalGroup> group;
  cserps::DeviceGroup* node_group = nullptr;
  if (local_size > 1) {
#ifdef CSERPS_HAVE_NCCL
    cserps::NcclGroupOptions options;
    options.device = device;
    options.timeout = cserps::NodeGroupTimeout(config, cserps::PsClientOptions{});
    options.setup_timeout = options.timeout;
    std::string dir = absl::GetFlag(FLAGS_group_dir);
    if (dir.empty()) {
      dir = cserps::DefaultNodeGroupDir(config.name(), worker_id);
    }
    options.id_path = absl::StrCat(dir, "/nccl_id");
    absl::StatusOr<std::unique_ptr<cserps::NcclGroup>> nccl = cserps::NcclGroup::Create(
        static_cast<uint32_t>(local_rank), local_size, options);
    if (!nccl.ok()) {
      return absl::Status(nccl.status().code(),
                          absl::StrCat("local group of local rank ", local_rank, " (",
                                       options.id_path, "): ", nccl.status().message()));
    }
    node_group = nccl->get();
    group = *std::move(nccl);
#else
    return absl::FailedPreconditionError(
        "--backend=cuda with cluster.local_size > 1: this cserps-worker was built "
        "without NCCL (none was found beside the CUDA toolkit)");
#endif
  }
  return Train(job, group.get(), worker_id, job.metrics.get(),
               [&job, node_group]() -> absl::StatusOr<std::unique_ptr<cserps::DeviceBackend>> {
                 return cserps::CudaBackend::ForJob(job.config, node_group);
               });
#else
  return absl::InternalError("unreachable: --backend=cuda without CUDA");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  cserps::SkipLockOrderChecksWithNdebug();
  absl::SetProgramUsageMessage(
      "cserps-worker --config=job.textproto [--rank=R] [--set='field=value;...'] "
      "[--backend=cpu|cuda] [--local_rank=J]");
  absl::ParseCommandLine(argc, argv);
  if (std::optional<std::string> all = cserps::RepeatedSetFlags(argc, argv)) {
    absl::SetFlag(&FLAGS_set, *all);
  }
  if (absl::GetFlag(FLAGS_blas_threads) > 0) {
    openblas_set_num_threads(absl::GetFlag(FLAGS_blas_threads));
  }
  absl::Status status = RunWorker();
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  return 0;
}
