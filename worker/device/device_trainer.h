// The training loop of a worker whose model, gradient and algorithm state
// live on a device (issue 6): the DeviceBackend (device_backend.h) computes
// the loss and gradient there, a DeviceAlgorithm (device_algorithms.h)
// steps the device model and averages through the staged pipeline
// (worker/staged_average.h), and the test set is evaluated there. Same
// plan (PlanTrainer), data order, schedule, initial push and pull, final
// average, metrics and summary files as the host Trainer (worker/trainer.h):
// on HostBackend it computes the host Trainer's bits, which is how it is
// tested without a GPU (tests/worker/device_trainer_test.cc); on CudaBackend
// (worker/cuda/cuda_backend.h) it is the GPU worker.
//
// In a node (cluster.local_size > 1) the averages are NodeStagedAverage's,
// whose collectives run on the staging buffer through the node's group.
// Not here (the host Trainer runs them): the algorithms HasDeviceAlgorithm
// refuses.
//
// Not thread-safe; on a CUDA backend, the device current at the backend's
// creation must be current on the calling thread.
#ifndef CSERPS_WORKER_DEVICE_DEVICE_TRAINER_H_
#define CSERPS_WORKER_DEVICE_DEVICE_TRAINER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/device/device_algorithms.h"
#include "worker/device/device_backend.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace cserps {

class DeviceTrainer {
 public:
  // `config` has defaults applied and is valid; `link` (as the host
  // Trainer's: a flat worker's client, or a node's client and group, whose
  // collectives the backend's staging device must be able to run),
  // `train` and `test` outlive the trainer. Errors: PlanTrainer's
  // (cluster.local_size, ranks, batch sizes, too few examples);
  // INVALID_ARGUMENT for a model that does not fit the data; UNIMPLEMENTED
  // for an algorithm without a device implementation (MakeDeviceAlgorithm);
  // the device's errors of the allocations. `metrics` (may be null)
  // outlives the trainer and gets the same step, traffic and accuracy
  // metrics as the host trainer's.
  static absl::StatusOr<std::unique_ptr<DeviceTrainer>> Create(
      const v1::JobConfig& config, TrainerLink link, const Dataset* train,
      const Dataset* test, std::unique_ptr<DeviceBackend> backend,
      WorkerMetrics* metrics = nullptr);

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
                const Dataset* train, const Dataset* test,
                std::unique_ptr<DeviceBackend> backend);
  absl::Status Init();
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
  // Declared before what queues work on it, so released after it.
  const std::unique_ptr<DeviceBackend> backend_;
  DeviceOps& ops_;  // backend_'s
  EpochBatcher batcher_;
  LrSchedule schedule_;
  const float slowdown_;
  WorkerMetrics* metrics_ = nullptr;  // null: no metrics
  std::unique_ptr<DeviceAlgorithm> algorithm_;
  DeviceVector x_;     // of ops_
  DeviceVector grad_;  // of ops_
  uint64_t step_ = 0;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_DEVICE_TRAINER_H_
