// cserps-worker: one training process of a job.
#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/job_flags.h"
#include "common/metrics.h"
#include "common/status.h"
#include "common/model_spec.h"
#include "common/split_overrides.h"
#include "spdlog/spdlog.h"
#include "worker/data/dataset.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, config, "", "Job config file (text-format cserps.v1.JobConfig).");
ABSL_FLAG(std::string, set, "",
          "Config overrides 'field.path=value', separated by ';' "
          "(e.g. --set='optimizer.lr=0.05;cluster.servers=10.0.0.5:7000,10.0.0.6:7000').");
ABSL_FLAG(int, rank, -1, "Rank to claim; -1 lets shard 0 assign the lowest free rank.");
ABSL_FLAG(std::string, worker_id, "",
          "Identity across retries of Register; default host:pid:nonce.");
ABSL_FLAG(int, blas_threads, 1,
          "OpenBLAS threads of this process. Keep 1 when several workers share "
          "a machine; 0 leaves OpenBLAS's default (one per core).");

ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics on http://ADDRESS/metrics (host:port; port 0 "
          "picks a free port); empty: no metrics.");

namespace {

// host:pid alone is not unique: containers on the host's network share its
// hostname and each runs its worker as pid 1.
std::string DefaultWorkerId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) | random();
  return absl::StrCat(host, ":", getpid(), ":", absl::Hex(nonce, absl::kZeroPad16));
}

absl::Status RunWorker() {
  ASSIGN_OR_RETURN(cserps::v1::JobConfig config,
                   cserps::LoadJobWithOverrides(
                       absl::GetFlag(FLAGS_config),
                       cserps::SplitOverrides(absl::GetFlag(FLAGS_set))));
  ASSIGN_OR_RETURN(cserps::ModelSpec spec, cserps::MakeModelSpec(config.model()));
  ASSIGN_OR_RETURN(cserps::Dataset train,
                   cserps::LoadMnistSplit(config.data().dir(), cserps::Split::kTrain,
                                          config.data().train_limit()));
  ASSIGN_OR_RETURN(cserps::Dataset test,
                   cserps::LoadMnistSplit(config.data().dir(), cserps::Split::kTest,
                                          config.data().test_limit()));
  ASSIGN_OR_RETURN(std::unique_ptr<cserps::PsClient> client,
                   cserps::PsClient::Connect(config, spec.num_params));
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) worker_id = DefaultWorkerId();
  ASSIGN_OR_RETURN(uint32_t rank, client->Register(absl::GetFlag(FLAGS_rank), worker_id));
  spdlog::info("rank {}/{}: {} parameters, {} training and {} test examples, algorithm {}",
               rank, config.cluster().num_workers(), spec.num_params, train.size,
               test.size, cserps::DescribeAlgorithm(config.algorithm()));
  // Declared before the trainer, which updates them until destroyed.
  std::unique_ptr<cserps::MetricsRegistry> metrics;
  std::unique_ptr<cserps::WorkerMetrics> worker_metrics;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_address);
      !address.empty()) {
    absl::StatusOr<std::unique_ptr<cserps::MetricsRegistry>> started =
        cserps::MetricsRegistry::Start(address);
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("--metrics_address: ", started.status().message()));
    }
    metrics = *std::move(started);
    ASSIGN_OR_RETURN(worker_metrics, cserps::WorkerMetrics::Create(
                                         metrics.get(), rank, config.algorithm().name()));
    std::printf("metrics on http://%s/metrics\n", metrics->address().c_str());
    std::fflush(stdout);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<cserps::Trainer> trainer,
                   cserps::Trainer::Create(config, client.get(), &train, &test,
                                           worker_metrics.get()));
  return trainer->Run();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "cserps-worker --config=job.textproto [--rank=R] [--set='field=value;...']");
  absl::ParseCommandLine(argc, argv);
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
