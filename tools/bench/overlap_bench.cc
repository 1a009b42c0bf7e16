// cserps-bench-overlap: does CoCoD-SGD overlap computation with
// communication? An in-process cluster (servers on 127.0.0.1, one thread per
// worker) trains the MLP on random data while every average is held back by
// an injected network delay D (a Communicator that completes an average no
// earlier than D after it started). A blocking algorithm (S-SGD) pays
// compute + D per step; an overlapping one (CoCoD-SGD with k = 1, Pipe-SGD)
// should pay about max(compute, D). Both limits are measured in the same run
// and printed next to the result.
#include <cblas.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model_spec.h"
#include "common/prng.h"
#include "common/status.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/algorithms/registry.h"
#include "worker/device/host_device_ops.h"
#include "worker/model/model.h"
#include "worker/ps/forwarding_communicator.h"

ABSL_FLAG(int, workers, 2, "Workers (threads).");
ABSL_FLAG(int, batch, 256, "Examples per worker per step (sets the compute time).");
ABSL_FLAG(int, delay_ms, 0, "Injected delay per average; 0 = the measured compute time.");
ABSL_FLAG(int, steps, 40, "Measured steps per algorithm.");

namespace cserps {
namespace {

// Completes every average no earlier than `delay` after it started: a
// network with that latency, injected at the transport seam.
class DelayedCommunicator final : public ForwardingCommunicator {
 public:
  DelayedCommunicator(Communicator* inner, absl::Duration delay)
      : ForwardingCommunicator(inner), delay_(delay) {}

  std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream, uint64_t step,
                                                      uint32_t ratio, float weight,
                                                      float lr) override {
    return std::make_unique<Delayed>(
        ForwardingCommunicator::BeginShardedAverage(stream, step, ratio, weight, lr),
        absl::Now() + delay_);
  }

 private:
  // A round whose replies are held back until `ready`.
  class Delayed final : public ShardedAverage {
   public:
    Delayed(std::unique_ptr<ShardedAverage> inner, absl::Time ready)
        : inner_(std::move(inner)), ready_(ready) {}
    const std::vector<uint32_t>& shards() const override { return inner_->shards(); }
    uint64_t payload_size(uint32_t shard) const override {
      return inner_->payload_size(shard);
    }
    absl::Status StartShard(uint32_t shard, absl::Span<const float> payload,
                            absl::Span<float> mean) override {
      return inner_->StartShard(shard, payload, mean);
    }
    absl::Status WaitShard(uint32_t shard) override {
      const absl::Status status = inner_->WaitShard(shard);
      absl::SleepFor(ready_ - absl::Now());
      return status;
    }

   private:
    std::unique_ptr<ShardedAverage> inner_;
    const absl::Time ready_;
  };

  const absl::Duration delay_;
};

// One worker thread: the CPU model and the algorithm's buffers in host
// memory, as in a CPU worker process.
struct Worker {
  std::unique_ptr<Model> model;
  std::unique_ptr<HostDeviceOps> ops;
  DeviceVector x, g;
  std::vector<float> features;
  std::vector<uint8_t> labels;
};

v1::JobConfig BenchConfig(const std::string& algorithm, int workers) {
  return testing::TestConfig(absl::StrCat(R"pb(
    cluster { servers: "127.0.0.1:0" servers: "127.0.0.1:0" num_workers: )pb", workers, R"pb(
              round_timeout_s: 60 }
    model { kind: MLP hidden: 256 }
    data { batch_size: 32 }
    optimizer { lr: 0.01 momentum_kind: NESTEROV momentum: 0.9 }
    algorithm { )pb", algorithm, R"pb( }
    epochs: 1
  )pb"));
}

// Mean wall time per step of `algorithm` over `steps` steps (after 3 warm-up
// steps), every worker computing a real gradient each step.
absl::StatusOr<double> MeasureStepMs(const std::string& algorithm, int workers, int batch,
                                     absl::Duration delay, int steps, bool compute) {
  const v1::JobConfig config = BenchConfig(algorithm, workers);
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config.model()));
  ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> cluster,
                   testing::InProcessCluster::Start(config, spec.num_params));
  const size_t d = spec.num_params;
  std::vector<float> x0(d);
  std::vector<Worker> w(workers);
  for (int r = 0; r < workers; ++r) {
    ASSIGN_OR_RETURN(w[r].model, MakeCpuModel(config.model()));
    w[r].ops = std::make_unique<HostDeviceOps>(d, config.algorithm().block_size());
    ASSIGN_OR_RETURN(w[r].x, w[r].ops->Allocate());
    ASSIGN_OR_RETURN(w[r].g, w[r].ops->Allocate());
    w[r].model->Initialize(1, absl::MakeSpan(x0));
    RETURN_IF_ERROR(w[r].ops->Upload(x0, w[r].x.data()));
    CounterRng rng(DeriveKey(7, r));
    for (int i = 0; i < batch * 784; ++i) w[r].features.push_back(rng.UniformFloat() - 0.5f);
    for (int i = 0; i < batch; ++i) w[r].labels.push_back(static_cast<uint8_t>(rng.Below(10)));
  }
  RETURN_IF_ERROR(cluster->client(0).PushModel(x0));
  const int warmup = 3;
  std::vector<absl::Time> start(workers), end(workers);
  RETURN_IF_ERROR(cluster->OnEveryRank([&](int r) -> absl::Status {
    DelayedCommunicator comm(&cluster->client(r), delay);
    AlgorithmContext context;
    context.config = &cluster->config();
    context.comm = &comm;
    context.ops = w[r].ops.get();
    context.weight = batch;
    ASSIGN_OR_RETURN(std::unique_ptr<Algorithm> algo, MakeAlgorithm(context));
    const Batch b{w[r].features, w[r].labels, static_cast<size_t>(batch), 784};
    for (int t = 0; t < warmup + steps; ++t) {
      if (t == warmup) start[r] = absl::Now();
      if (compute) {
        RETURN_IF_ERROR(w[r].model
                            ->LossAndGradient(absl::MakeConstSpan(w[r].x.data(), d), b,
                                              absl::MakeSpan(w[r].g.data(), d))
                            .status());
      }
      RETURN_IF_ERROR(algo->Step(t, 0.01f, w[r].g.data(), w[r].x.data()));
    }
    end[r] = absl::Now();
    return algo->Finish(warmup + steps, w[r].x.data());
  }));
  return absl::ToDoubleMilliseconds(end[0] - start[0]) / steps;
}

// Mean time of one gradient computation alone (one worker per thread, all
// at once, as in the training runs).
double MeasureComputeMs(int workers, int batch, int steps) {
  const v1::JobConfig config = BenchConfig(R"(name: "ssgd")", workers);
  std::vector<double> ms(workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Model> model = *MakeCpuModel(config.model());
      std::vector<float> x(model->spec().num_params), g(x.size()), f(batch * 784, 0.1f);
      std::vector<uint8_t> labels(batch, 3);
      model->Initialize(1, absl::MakeSpan(x));
      const Batch b{f, labels, static_cast<size_t>(batch), 784};
      // The CPU model's calls cannot fail.
      model->LossAndGradient(x, b, absl::MakeSpan(g)).IgnoreError();
      const absl::Time t0 = absl::Now();
      for (int t = 0; t < steps; ++t) model->LossAndGradient(x, b, absl::MakeSpan(g)).IgnoreError();
      ms[r] = absl::ToDoubleMilliseconds(absl::Now() - t0) / steps;
    });
  }
  for (std::thread& t : threads) t.join();
  return ms[0];
}

int Run() {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int steps = absl::GetFlag(FLAGS_steps);
  const double compute_ms = MeasureComputeMs(workers, batch, steps);
  const int delay_ms = absl::GetFlag(FLAGS_delay_ms) > 0 ? absl::GetFlag(FLAGS_delay_ms)
                                                         : static_cast<int>(compute_ms + 0.5);
  const absl::Duration delay = absl::Milliseconds(delay_ms);
  // Communication alone: S-SGD rounds without computing.
  absl::StatusOr<double> comm_ms =
      MeasureStepMs(R"(name: "ssgd")", workers, batch, delay, steps, /*compute=*/false);
  if (!comm_ms.ok()) {
    std::fprintf(stderr, "%s\n", comm_ms.status().ToString().c_str());
    return 1;
  }
  std::printf("workers %d, batch %d, injected delay %d ms per average\n", workers, batch,
              delay_ms);
  std::printf("compute alone %.1f ms/step, communication alone %.1f ms/step\n", compute_ms,
              *comm_ms);
  std::printf("limits: sum %.1f ms, max %.1f ms\n\n", compute_ms + *comm_ms,
              std::max(compute_ms, *comm_ms));
  std::printf("%-22s %10s %12s %12s\n", "algorithm", "ms/step", "step/max", "step/sum");
  const std::pair<const char*, const char*> algorithms[] = {
      {"ssgd (blocking)", R"(name: "ssgd")"},
      {"cocod-sgd k=1", R"(name: "cocod-sgd" period: 1)"},
      {"pipe-sgd", R"(name: "pipe-sgd")"},
  };
  for (const auto& [label, algorithm] : algorithms) {
    absl::StatusOr<double> ms = MeasureStepMs(algorithm, workers, batch, delay, steps, true);
    if (!ms.ok()) {
      std::fprintf(stderr, "%s: %s\n", label, ms.status().ToString().c_str());
      return 1;
    }
    std::printf("%-22s %10.1f %12.2f %12.2f\n", label, *ms,
                *ms / std::max(compute_ms, *comm_ms), *ms / (compute_ms + *comm_ms));
  }
  return 0;
}

}  // namespace
}  // namespace cserps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // One BLAS thread per worker thread, as in the worker processes: OpenBLAS
  // threads shared by several callers would serialise them.
  openblas_set_num_threads(1);
  return cserps::Run();
}
