// The training loop of a flat GPU worker (cluster.local_size 1) whose model,
// gradient, direction and momentum stay on the device (issue 6): each batch
// is uploaded through pinned memory, CudaModel::LossAndGradientDevice
// computes the gradient, a DeviceAlgorithm (device_algorithms.h) steps the
// device model and averages through the staged pipeline
// (worker/staged_average.h, cuda_staging.h), and the test set is evaluated
// with EvaluateDevice. Same data order, schedule, initial push/pull, final
// average and summary files as the host Trainer (worker/trainer.h), so the
// two backends' runs compare line by line.
//
// Not supported here (the host Trainer, --backend=cuda through host spans,
// still runs them): nodes of several local ranks, algorithms other than
// HasDeviceAlgorithm's, and Prometheus metrics.
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
#include "worker/cuda/cuda_staging.h"
#include "worker/cuda/device_algorithms.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace cserps {

class DeviceTrainer {
 public:
  // `config` has defaults applied and is valid; `client` (registered, every
  // shard), `train` and `test` outlive the trainer. FAILED_PRECONDITION
  // naming cluster.local_size unless it is 1; UNIMPLEMENTED for an
  // algorithm without a device implementation; INVALID_ARGUMENT as
  // Trainer::Create for ranks, batch sizes and model shapes; CUDA errors of
  // the allocations. `metrics` (may be null) outlives the trainer and gets
  // the same step, traffic and accuracy metrics as the host trainer's.
  static absl::StatusOr<std::unique_ptr<DeviceTrainer>> Create(
      const v1::JobConfig& config, PsClient* client, const Dataset* train,
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
  size_t steps_per_epoch() const { return steps_per_epoch_; }
  const std::vector<CurvePoint>& curve() const { return curve_; }
  const FinalReport& final_report() const { return final_; }

 private:
  DeviceTrainer(const v1::JobConfig& config, PsClient* client, const Dataset* train,
                const Dataset* test, size_t steps_per_epoch, Range range,
                uint32_t batch_size, std::unique_ptr<CudaModel> model);
  absl::Status Init();
  // Copies `batch` to features_ / labels_ through pinned memory (queued).
  absl::Status Upload(const Batch& batch);
  absl::StatusOr<EvalSums> Evaluate(const float* params);
  // Steps times model floats over the training floats pushed so far.
  double AchievedCompression() const;

  const v1::JobConfig config_;
  PsClient* const client_;
  const Dataset* const test_;
  const uint32_t rank_;
  const size_t steps_per_epoch_;
  const uint32_t batch_size_;
  const size_t num_params_;
  std::unique_ptr<CudaModel> model_;
  EpochBatcher batcher_;
  LrSchedule schedule_;
  const float slowdown_;
  WorkerMetrics* metrics_ = nullptr;  // null: no metrics
  cudaStream_t stream_ = nullptr;
  // Both queue on stream_: the destructor releases them before the stream.
  std::unique_ptr<CudaStagingDevice> staging_;
  std::unique_ptr<DeviceAlgorithm> algorithm_;
  size_t max_rows_ = 0;  // of the batch buffers
  PinnedBuffer<float> host_features_;
  PinnedBuffer<uint8_t> host_labels_;
  DeviceBuffer<float> features_;
  DeviceBuffer<uint8_t> labels_;
  DeviceBuffer<float> x_;
  DeviceBuffer<float> grad_;
  DeviceBuffer<float> loss_;
  DeviceBuffer<double> loss_sum_;
  DeviceBuffer<unsigned long long> correct_;
  PinnedBuffer<float> host_loss_;
  PinnedBuffer<double> host_loss_sum_;
  PinnedBuffer<unsigned long long> host_correct_;
  uint64_t step_ = 0;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_DEVICE_TRAINER_H_
