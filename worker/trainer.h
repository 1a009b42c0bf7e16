// The worker's training loop: data shard, model forward/backward, the
// algorithm's step, evaluation, progress lines and the run's outputs.
#ifndef CSERPS_WORKER_TRAINER_H_
#define CSERPS_WORKER_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/metrics.h"
#include "cserps/v1/config.pb.h"
#include "worker/algorithms/algorithm.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/model/model.h"
#include "worker/optim/direction.h"
#include "worker/optim/lr_schedule.h"
#include "worker/ps_client.h"

namespace cserps {

// One row of the learning curve, written at the end of every epoch.
struct CurvePoint {
  uint64_t epoch = 0;
  uint64_t step = 0;
  double train_loss = 0;  // mean over the epoch's steps
  double test_loss = 0;
  double test_accuracy = 0;
  double wall_seconds = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
};

// What the end of training measured.
struct FinalReport {
  double local_accuracy = 0;   // this worker's model after the last step
  double global_accuracy = 0;  // the servers' model after the final average
  uint64_t training_floats_pushed = 0;  // PushPull values of the steps
  double achieved_compression = 0;      // steps * d / training_floats_pushed
};

class Trainer {
 public:
  // `config` has defaults applied and is valid; `client` is registered
  // (client->rank() is this worker's rank). `train` and `test` and `client`
  // outlive the trainer. With `metrics` (which outlives the trainer too),
  // every step and evaluation updates it; nullptr: no metrics.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& config, PsClient* client, const Dataset* train,
      const Dataset* test, WorkerMetrics* metrics = nullptr);

  // Rank 0 initialises the model from the job seed and pushes it; every rank
  // then pulls it, so all start from the identical model.
  absl::Status InitializeModel();
  // Runs the next step; returns its training loss.
  absl::StatusOr<float> Step();
  // Loss and accuracy of the local model on the test set.
  EvalSums EvaluateTest();
  // After the last step: measures the local model, runs the algorithm's
  // final average and measures the servers' (global) model.
  absl::Status FinishTraining();
  // InitializeModel, then every epoch's steps with progress lines every
  // log_every_steps and a test evaluation at the end of each epoch; finally
  // writes <output_dir>/worker_<rank>.json and .csv.
  absl::Status Run();

  absl::Span<const float> params() const { return x_; }
  uint64_t step() const { return step_; }
  size_t steps_per_epoch() const { return steps_per_epoch_; }
  const std::vector<CurvePoint>& curve() const { return curve_; }
  const FinalReport& final_report() const { return final_; }

 private:
  Trainer(const v1::JobConfig& config, PsClient* client, const Dataset* train,
          const Dataset* test, size_t steps_per_epoch, Range range,
          uint32_t batch_size, std::unique_ptr<Model> model);
  absl::Status WriteOutputs(double wall_seconds) const;
  // Floats the training steps pushed so far, over every stream.
  // S-SGD's floats for the steps so far over `floats_pushed`.
  double AchievedCompression(uint64_t floats_pushed) const;
  uint64_t TrainingFloatsPushed() const;
  void UpdateTrafficMetrics();
  EvalSums Evaluate(absl::Span<const float> params);

  const v1::JobConfig config_;
  PsClient* const client_;
  const Dataset* const test_;
  const uint32_t rank_;
  const size_t steps_per_epoch_;
  const uint32_t batch_size_;
  std::unique_ptr<Model> model_;
  EpochBatcher batcher_;
  Direction direction_;
  LrSchedule schedule_;
  std::unique_ptr<Algorithm> algorithm_;
  const float slowdown_;  // data.rank_slowdown of this rank, 1 = full speed
  std::vector<float> x_;
  std::vector<float> grad_;
  uint64_t step_ = 0;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
  WorkerMetrics* metrics_ = nullptr;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_H_
