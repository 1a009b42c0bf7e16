// The training loop of a GPU worker whose model, gradient, direction,
// momentum and residuals stay on the device (issue 6): each batch
// is uploaded through pinned memory, CudaModel::LossAndGradientDevice
// computes the gradient, a DeviceAlgorithm (worker/device/device_algorithms.h)
// on CudaDeviceOps steps the device model and averages through the staged
// pipeline (worker/staged_average.h, cuda_staging.h), and the test set is
// evaluated with EvaluateDevice. Same data order, schedule, initial
// push/pull, final average, metrics and summary files as the host Trainer
// (worker/trainer.h), so the two backends' runs compare line by line.
//
// In a node (cluster.local_size > 1) the averages are NodeStagedAverage's,
// whose collectives run on the staging buffer through the NCCL group.
// Not supported here (the host Trainer, --backend=cuda through host spans,
// still runs them): the algorithms HasDeviceAlgorithm refuses.
//
// The device current at Create (the model's) must be current on the
// calling thread. Not thread-safe.
#ifndef CSERPS_WORKER_CUDA_DEVICE_TRAINER_H_
#define CSERPS_WORKER_CUDA_DEVICE_TRAINER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/read_back.h"
#include "worker/cuda/cuda_device_ops.h"
#include "worker/device/device_algorithms.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace cserps {

class DeviceTrainer {
 public:
  // `config` has defaults applied and is valid; `link` (as the host
  // Trainer's: a flat worker's client, or a node's client and group whose
  // staging collectives run on the device), `train` and `test` outlive the
  // trainer. Errors: PlanTrainer's (cluster.local_size, ranks, batch sizes,
  // too few examples); INVALID_ARGUMENT for a model that does not fit the
  // data; UNIMPLEMENTED for an algorithm without a device implementation
  // (MakeDeviceAlgorithm); CUDA errors of the allocations. `metrics` (may be
  // null) outlives the trainer and gets the same step, traffic and accuracy
  // metrics as the host trainer's.
  static absl::StatusOr<std::unique_ptr<DeviceTrainer>> Create(
      const v1::JobConfig& config, TrainerLink link, const Dataset* train,
      const Dataset* test, std::unique_ptr<CudaModel> model,
      WorkerMetrics* metrics = nullptr);
  ~DeviceTrainer();

  // As Trainer's: rank 0 initialises and pushes the model, every rank pulls
  // it into the device model.
  absl::Status InitializeModel();
  // Runs the next step; returns its training loss.
  absl::StatusOr<float> Step();
  // Loss and accuracy of the device model on the test set.
  absl::StatusOr<EvalSums> EvaluateTest();
  // Measures the local model, runs the algorithm's final average and
  // measures the servers' model.
  absl::Status FinishTraining();
  // As Trainer::Run, writing the same summary files.
  absl::Status Run();

  // A host copy of the device model (waits for the device).
  absl::StatusOr<std::vector<float>> Params();
  uint64_t step() const { return step_; }
  size_t steps_per_epoch() const { return plan_.steps_per_epoch; }
  const std::vector<CurvePoint>& curve() const { return curve_; }
  const FinalReport& final_report() const { return final_; }

 private:
  DeviceTrainer(const v1::JobConfig& config, TrainerLink link, TrainerPlan plan,
                const Dataset* train, const Dataset* test, std::unique_ptr<CudaModel> model);
  absl::Status Init();
  // Copies `batch` to features_ / labels_ through pinned memory (queued).
  absl::Status Upload(const Batch& batch);
  absl::StatusOr<EvalSums> Evaluate(const float* params);
  // Steps times this process's shard floats over the training floats
  // pushed so far.
  double AchievedCompression() const;

  const v1::JobConfig config_;
  const TrainerLink link_;
  const TrainerPlan plan_;
  PsClient* const client_;
  const Dataset* const test_;
  const size_t num_params_;
  std::unique_ptr<CudaModel> model_;
  EpochBatcher batcher_;
  LrSchedule schedule_;
  const float slowdown_;
  WorkerMetrics* metrics_ = nullptr;  // null: no metrics
  cudaStream_t stream_ = nullptr;
  // These queue on stream_: the destructor releases them before the stream.
  std::unique_ptr<CudaDeviceOps> ops_;
  std::unique_ptr<DeviceAlgorithm> algorithm_;
  DeviceVector x_;     // of ops_
  DeviceVector grad_;  // of ops_
  size_t max_rows_ = 0;  // of the batch buffers
  PinnedBuffer<float> host_features_;
  PinnedBuffer<uint8_t> host_labels_;
  DeviceBuffer<float> features_;
  DeviceBuffer<uint8_t> labels_;
  ScalarReadBack read_back_;
  uint64_t step_ = 0;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_DEVICE_TRAINER_H_
