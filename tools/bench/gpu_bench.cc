// cserps-bench-gpu: what the CUDA backend costs on this machine, each number
// next to a reference measured in the same run.
//   - gather / scatter of GRBS-selected blocks, in GB/s, next to a
//     device-to-device cudaMemcpy of the same bytes;
//   - model steps (loss and gradient) in samples/s: CPU backend, CudaModel
//     on device buffers, and CudaBackend as the trainer steps it (parameters
//     and gradient on the device, the batch uploaded through pinned memory,
//     the loss read back);
//   - top-k by magnitude on the device for d = 10M and 100M, next to the CPU
//     SelectTopK;
//   - whole training steps in samples/s (model, algorithm, averages with
//     in-process servers on 127.0.0.1, one worker): the Trainer on
//     CudaBackend next to the Trainer on HostBackend (the CPU model), for
//     S-SGD, CSER and gTop-k S-SGD.
// Prints one table. Exits 0 with a message when no CUDA device is present.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "common/status.h"
#include "tools/cluster/in_process_cluster.h"
#include "tools/cluster/random_dataset.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/kernels/block_gather.h"
#include "worker/cuda/kernels/cuda_model.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/topk.h"
#include "worker/device/topk_select.h"
#include "worker/model/model.h"
#include "worker/trainer/trainer.h"

ABSL_FLAG(uint64_t, gather_d, 64ull << 20, "Model floats for the gather/scatter rows.");
ABSL_FLAG(uint32_t, block_size, 256, "GRBS block size (floats).");
ABSL_FLAG(uint32_t, ratio, 4, "GRBS ratio R: about 1/R of the blocks are moved.");
ABSL_FLAG(int, batch, 256, "Examples per model step.");
ABSL_FLAG(double, model_seconds, 1.5, "Time budget per model-step measurement.");
ABSL_FLAG(double, density, 0.001, "Top-k density k/d.");
ABSL_FLAG(bool, topk_100m, true, "Include the d = 100M top-k rows.");

namespace cserps {
namespace {

struct Row {
  std::string section, item, value, reference;
};

class Table {
 public:
  void Add(std::string section, std::string item, std::string value,
           std::string reference) {
    rows_.push_back({std::move(section), std::move(item), std::move(value),
                     std::move(reference)});
    std::printf("  %-8s %-40s %s\n", rows_.back().section.c_str(),
                rows_.back().item.c_str(), rows_.back().value.c_str());
    std::fflush(stdout);
  }
  void Print() const {
    size_t w[4] = {7, 4, 5, 9};
    for (const Row& r : rows_) {
      w[0] = std::max(w[0], r.section.size());
      w[1] = std::max(w[1], r.item.size());
      w[2] = std::max(w[2], r.value.size());
      w[3] = std::max(w[3], r.reference.size());
    }
    auto line = [&](const std::string& a, const std::string& b,
                    const std::string& c, const std::string& d) {
      std::printf("| %-*s | %-*s | %*s | %-*s |\n", static_cast<int>(w[0]), a.c_str(),
                  static_cast<int>(w[1]), b.c_str(), static_cast<int>(w[2]), c.c_str(),
                  static_cast<int>(w[3]), d.c_str());
    };
    line("section", "case", "value", "reference");
    line(std::string(w[0], '-'), std::string(w[1], '-'), std::string(w[2], '-'),
         std::string(w[3], '-'));
    for (const Row& r : rows_) line(r.section, r.item, r.value, r.reference);
  }

 private:
  std::vector<Row> rows_;
};

// Median time in ms of `reps` runs of `fn` on `stream`, after one warm-up.
absl::StatusOr<double> TimeDeviceMs(cudaStream_t stream, int reps,
                                    const std::function<absl::Status()>& fn) {
  RETURN_IF_ERROR(fn());
  CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    RETURN_IF_ERROR(fn());
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    float t = 0;
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string GBs(double bytes, double ms) {
  return absl::StrFormat("%.0f GB/s", bytes / (ms * 1e-3) / 1e9);
}

absl::Status GatherRows(cudaStream_t stream, Table* table) {
  const uint64_t d = absl::GetFlag(FLAGS_gather_d);
  const uint32_t block = absl::GetFlag(FLAGS_block_size);
  const uint32_t ratio = absl::GetFlag(FLAGS_ratio);
  const uint64_t num_blocks = (d + block - 1) / block;
  const std::vector<uint64_t> blocks = SelectBlocks(1, 0, 0, ratio, num_blocks);
  const uint64_t staged = cuda::GatheredFloats(d, block, blocks);

  ASSIGN_OR_RETURN(DeviceBuffer<float> model, DeviceBuffer<float>::Allocate(d));
  ASSIGN_OR_RETURN(DeviceBuffer<float> staging, DeviceBuffer<float>::Allocate(staged));
  ASSIGN_OR_RETURN(DeviceBuffer<float> copy, DeviceBuffer<float>::Allocate(staged));
  ASSIGN_OR_RETURN(DeviceBuffer<uint64_t> ids, DeviceBuffer<uint64_t>::Allocate(blocks.size()));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(ids.data(), blocks.data(),
                                         blocks.size() * sizeof(uint64_t),
                                         cudaMemcpyHostToDevice));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(model.data(), 0, model.bytes(), stream));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(staging.data(), 0, staging.bytes(), stream));

  const int reps = 20;
  const double payload = static_cast<double>(staged) * sizeof(float);
  const std::string shape = absl::StrFormat("d=%dM block=%d R=%d (%.0f MB)", d >> 20,
                                            block, ratio, payload / 1e6);
  ASSIGN_OR_RETURN(const double memcpy_ms, TimeDeviceMs(stream, reps, [&] {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy.data(), staging.data(), staging.bytes(),
                                                cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }));
  const cuda::BlockList list{d, block, ids.data(), blocks.size()};
  // Bytes read plus written, for the copy and for every kernel alike.
  const std::string reference = "memcpy D2D " + GBs(2 * payload, memcpy_ms);
  ASSIGN_OR_RETURN(const double gather_ms, TimeDeviceMs(stream, reps, [&] {
    return cuda::LaunchGatherBlocks(model.data(), list, staging.data(), stream);
  }));
  table->Add("blocks", "gather " + shape, GBs(2 * payload, gather_ms), reference);
  ASSIGN_OR_RETURN(const double scatter_ms, TimeDeviceMs(stream, reps, [&] {
    return cuda::LaunchScatterBlocks(staging.data(), list, model.data(), stream);
  }));
  table->Add("blocks", "scatter " + shape, GBs(2 * payload, scatter_ms), reference);
  ASSIGN_OR_RETURN(const double axpy_ms, TimeDeviceMs(stream, reps, [&] {
    return cuda::LaunchScatterAxpyBlocks(staging.data(), -1e-3f, list, model.data(), stream);
  }));
  table->Add("blocks", "scatter-axpy " + shape, GBs(3 * payload, axpy_ms), reference);
  return absl::OkStatus();
}

struct ModelCase {
  std::string name;
  v1::ModelConfig config;
};

std::vector<ModelCase> ModelCases() {
  std::vector<ModelCase> cases;
  v1::ModelConfig softmax;
  softmax.set_kind(v1::ModelConfig::SOFTMAX);
  cases.push_back({"softmax 784-10", softmax});
  v1::ModelConfig mlp;
  mlp.set_kind(v1::ModelConfig::MLP);
  mlp.add_hidden(256);
  cases.push_back({"mlp 784-256-10", mlp});
  v1::ModelConfig wide;
  wide.set_kind(v1::ModelConfig::MLP);
  wide.add_hidden(2048);
  wide.add_hidden(2048);
  cases.push_back({"mlp 784-2048-2048-10", wide});
  // The default CNN: 28 x 28 x 1, conv stages [16, 32], kernel 5.
  v1::ModelConfig cnn;
  cnn.set_kind(v1::ModelConfig::CNN);
  cases.push_back({"cnn (defaults)", cnn});
  return cases;
}

// Steps of `step` until the time budget is spent (at least 3); samples/s.
absl::StatusOr<double> SamplesPerSecond(size_t batch,
                                        const std::function<absl::Status()>& step) {
  RETURN_IF_ERROR(step());  // warm-up: scratch, cuBLAS heuristics
  const absl::Duration budget = absl::Seconds(absl::GetFlag(FLAGS_model_seconds));
  const absl::Time start = absl::Now();
  int steps = 0;
  while (steps < 3 || absl::Now() - start < budget) {
    RETURN_IF_ERROR(step());
    ++steps;
  }
  return static_cast<double>(steps * batch) / absl::ToDoubleSeconds(absl::Now() - start);
}

std::string Rate(const absl::StatusOr<double>& r) {
  if (!r.ok()) return "n/a";
  return absl::StrFormat("%.0f samples/s", *r);
}

absl::Status ModelRows(cudaStream_t stream, Table* table) {
  const size_t batch = static_cast<size_t>(absl::GetFlag(FLAGS_batch));
  for (const ModelCase& c : ModelCases()) {
    const absl::StatusOr<ModelSpec> spec_or = MakeModelSpec(c.config);
    if (!spec_or.ok()) {
      table->Add("model", c.name, "n/a", std::string(spec_or.status().message()));
      continue;
    }
    const ModelSpec& spec = *spec_or;
    CounterRng rng(5);
    std::vector<float> features(batch * spec.input_dim);
    for (float& x : features) x = rng.UniformFloat();
    std::vector<uint8_t> labels(batch);
    for (uint8_t& y : labels) y = static_cast<uint8_t>(rng.Below(spec.num_classes));
    const Batch view{features, labels, batch, spec.input_dim};
    std::vector<float> params(spec.num_params), grad(spec.num_params);

    absl::StatusOr<double> cpu_rate = absl::UnimplementedError("no CPU model");
    absl::StatusOr<std::unique_ptr<Model>> cpu = MakeCpuModel(c.config);
    if (cpu.ok()) {
      (*cpu)->Initialize(1, absl::MakeSpan(params));
      cpu_rate = SamplesPerSecond(batch, [&] {
        return (*cpu)->LossAndGradient(params, view, absl::MakeSpan(grad)).status();
      });
    }
    const std::string cpu_text =
        "cpu " + (cpu.ok() ? Rate(cpu_rate) : std::string(cpu.status().message()));

    absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Create(c.config);
    if (!gpu.ok()) {
      table->Add("model", c.name + " cuda", "n/a", cpu_text + "; " +
                                                       std::string(gpu.status().message()));
      continue;
    }
    CudaModel& model = **gpu;
    model.Initialize(1, absl::MakeSpan(params));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_params, DeviceBuffer<float>::Allocate(params.size()));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_grad, DeviceBuffer<float>::Allocate(params.size()));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_features,
                     DeviceBuffer<float>::Allocate(features.size()));
    ASSIGN_OR_RETURN(DeviceBuffer<uint8_t> d_labels, DeviceBuffer<uint8_t>::Allocate(batch));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_loss, DeviceBuffer<float>::Allocate(1));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_params.data(), params.data(), d_params.bytes(),
                                           cudaMemcpyHostToDevice));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_features.data(), features.data(),
                                           d_features.bytes(), cudaMemcpyHostToDevice));
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(d_labels.data(), labels.data(), batch, cudaMemcpyHostToDevice));
    RETURN_IF_ERROR(model.Reserve(batch));
    // Synchronising every 16 steps keeps the queue short without timing
    // each launch's latency.
    int queued = 0;
    const absl::StatusOr<double> device_rate = SamplesPerSecond(batch, [&] {
      RETURN_IF_ERROR(model.LossAndGradientDevice(d_params.data(), d_features.data(),
                                                  d_labels.data(), batch, d_grad.data(),
                                                  d_loss.data(), stream));
      if (++queued % 16 == 0) CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      return absl::OkStatus();
    });
    CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    RETURN_IF_ERROR(device_rate.status());
    table->Add("model", c.name + " cuda, device buffers", Rate(device_rate), cpu_text);

    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                     CudaBackend::Create(std::move(*gpu), absl::GetFlag(FLAGS_block_size)));
    RETURN_IF_ERROR(backend->Reserve(batch));
    const absl::StatusOr<double> backend_rate = SamplesPerSecond(batch, [&] {
      return backend->LossAndGradient(d_params.data(), view, d_grad.data()).status();
    });
    RETURN_IF_ERROR(backend_rate.status());
    table->Add("model", c.name + " cuda backend, batch uploaded", Rate(backend_rate),
               cpu_text);
  }
  return absl::OkStatus();
}

absl::Status TopKRows(cudaStream_t stream, Table* table) {
  std::vector<uint64_t> sizes = {10'000'000};
  if (absl::GetFlag(FLAGS_topk_100m)) sizes.push_back(100'000'000);
  for (const uint64_t d : sizes) {
    const uint64_t k = std::max<uint64_t>(
        1, static_cast<uint64_t>(static_cast<double>(d) * absl::GetFlag(FLAGS_density)));
    std::vector<float> values(d);
    CounterRng rng(9);
    for (float& v : values) v = 2.0f * rng.UniformFloat() - 1.0f;

    const absl::Time cpu_start = absl::Now();
    std::vector<uint32_t> positions;
    SelectTopK(values, k, &positions);
    const double cpu_ms = absl::ToDoubleMilliseconds(absl::Now() - cpu_start);

    ASSIGN_OR_RETURN(const size_t bytes, cuda::TopKWorkspaceBytes(d, k));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_values, DeviceBuffer<float>::Allocate(d));
    ASSIGN_OR_RETURN(DeviceBuffer<char> workspace, DeviceBuffer<char>::Allocate(bytes));
    ASSIGN_OR_RETURN(DeviceBuffer<uint32_t> d_positions, DeviceBuffer<uint32_t>::Allocate(k));
    ASSIGN_OR_RETURN(DeviceBuffer<float> d_selected, DeviceBuffer<float>::Allocate(k));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d_values.data(), values.data(), d_values.bytes(),
                                           cudaMemcpyHostToDevice));
    ASSIGN_OR_RETURN(const double gpu_ms, TimeDeviceMs(stream, 5, [&] {
      return cuda::LaunchTopK(d_values.data(), d, k, workspace.data(), bytes,
                              d_positions.data(), d_selected.data(), stream);
    }));
    // The device's answer must be the CPU's; a benchmark of a wrong answer
    // is worthless.
    std::vector<uint32_t> device_positions(k);
    CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_positions.data(), d_positions.data(),
                                           k * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    if (device_positions != positions) {
      return absl::InternalError(absl::StrCat("top-k d=", d, " k=", k,
                                              ": device positions differ from SelectTopK"));
    }
    table->Add("topk", absl::StrFormat("d=%dM k=%d", d / 1'000'000, k),
               absl::StrFormat("%.2f ms", gpu_ms),
               absl::StrFormat("cpu SelectTopK %.0f ms", cpu_ms));
  }
  return absl::OkStatus();
}

// Samples/s of whole steps of `trainer`, after the initial model.
absl::StatusOr<double> TrainerRate(Trainer& trainer, size_t batch) {
  RETURN_IF_ERROR(trainer.InitializeModel());
  return SamplesPerSecond(batch, [&] { return trainer.Step().status(); });
}

// The job of the trainer rows: one worker, two shards, an MLP.
absl::StatusOr<v1::JobConfig> TrainerJob(absl::string_view algorithm, size_t batch) {
  ASSIGN_OR_RETURN(v1::JobConfig config,
                   ParseJobConfig(absl::StrCat(
                                      "name: \"bench\" seed: 3 epochs: 1000\n"
                                      // Placeholders: the in-process cluster
                                      // listens on ports of its own.
                                      "cluster { servers: \"127.0.0.1:1\" "
                                      "servers: \"127.0.0.1:2\" num_workers: 1 }\n"
                                      "model { kind: MLP hidden: 512 hidden: 256 }\n"
                                      "data { batch_size: ",
                                      batch, " }\n",
                                      "optimizer { lr: 0.05 momentum: 0.9 "
                                      "momentum_kind: NESTEROV }\n",
                                      "algorithm { ", algorithm, " block_size: 1024 }\n"),
                                  "the trainer rows' job"));
  ApplyDefaults(&config);
  RETURN_IF_ERROR(ValidateJobConfig(config));
  return config;
}

absl::Status TrainerRows(Table* table) {
  const size_t batch = static_cast<size_t>(absl::GetFlag(FLAGS_batch));
  const Dataset train = testing::RandomDataset(64 * batch, 784, 10, 1);
  const Dataset test = testing::RandomDataset(1000, 784, 10, 2);
  const std::pair<const char*, const char*> algorithms[] = {
      {"ssgd", R"(name: "ssgd")"},
      {"cser", R"(name: "cser" period: 8 ratio_c1: 4 ratio_c2: 32)"},
      {"gtopk-ssgd", R"(name: "gtopk-ssgd" density: 0.01)"}};
  for (const auto& [name, algorithm] : algorithms) {
    ASSIGN_OR_RETURN(v1::JobConfig config, TrainerJob(algorithm, batch));
    ASSIGN_OR_RETURN(const ModelSpec spec, MakeModelSpec(config.model()));
    ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> host_cluster,
                     testing::InProcessCluster::Start(config, spec.num_params));
    // The default backend: HostBackend with the CPU model.
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> host,
                     Trainer::Create(host_cluster->config(), &host_cluster->client(0), &train,
                                     &test));
    const absl::StatusOr<double> host_rate = TrainerRate(*host, batch);

    ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> device_cluster,
                     testing::InProcessCluster::Start(config, spec.num_params));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::ForJob(config));
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> device,
                     Trainer::Create(device_cluster->config(),
                                     {&device_cluster->client(0), nullptr}, &train, &test,
                                     /*metrics=*/nullptr, std::move(backend)));
    const absl::StatusOr<double> device_rate = TrainerRate(*device, batch);
    RETURN_IF_ERROR(device_rate.status());
    table->Add("trainer", absl::StrCat(name, ", mlp 784-512-256-10, cuda backend"),
               Rate(device_rate), "host backend (cpu) " + Rate(host_rate));
  }
  return absl::OkStatus();
}

int Run() {
  if (CudaDeviceCount() == 0) {
    std::printf("cserps-bench-gpu: no CUDA device present; nothing measured.\n");
    return 0;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("device 0: %s, %d SMs, %.0f GiB; host: %u hardware threads\n", prop.name,
                prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0,
                std::thread::hardware_concurrency());
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "cserps-bench-gpu: cudaStreamCreate failed\n");
    return 1;
  }
  Table table;
  absl::Status status = GatherRows(stream, &table);
  if (status.ok()) status = ModelRows(stream, &table);
  if (status.ok()) status = TopKRows(stream, &table);
  if (status.ok()) status = TrainerRows(&table);
  std::printf("\n");
  table.Print();
  static_cast<void>(cudaStreamDestroy(stream));
  if (!status.ok()) {
    std::fprintf(stderr, "cserps-bench-gpu: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace cserps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cserps::Run();
}
