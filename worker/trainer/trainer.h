// The worker's training loop: data partition, the model's loss and
// gradient on its backend, the algorithm's step, evaluation, progress lines,
// metrics and the run's summary files. One loop for every algorithm and
// backend: the DeviceBackend (worker/device/device_backend.h) holds the
// model, gradient and algorithm state in its memory (HostBackend: host
// memory and the CPU model; CudaBackend, worker/cuda/cuda_backend.h: a GPU),
// and the algorithm (worker/algorithms/) steps it there.
//
// Not thread-safe; on a CUDA backend, the device current at the backend's
// creation must be current on the calling thread.
#ifndef CSERPS_WORKER_TRAINER_TRAINER_H_
#define CSERPS_WORKER_TRAINER_TRAINER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "cserps/v1/config.pb.h"
#include "worker/algorithms/algorithm.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/device/device_backend.h"
#include "worker/optim/lr_schedule.h"
#include "worker/trainer/trainer_plan.h"
#include "worker/trainer/training_summary.h"

namespace cserps {

class Trainer {
 public:
  // `config` has defaults applied and is valid; `link` (a flat worker's
  // client, or a node's client and group, whose collectives the backend's
  // staging device must be able to run), `train` and `test` outlive the
  // trainer. `metrics` (may be null: none) outlives the trainer too and is
  // updated by every step and evaluation. `backend` null: HostBackend with
  // the CPU model of config.model. Errors: PlanTrainer's
  // (cluster.local_size, ranks, batch sizes, too few examples);
  // INVALID_ARGUMENT for a model that does not fit the data; MakeAlgorithm's
  // (an algorithm without a form for nodes, say); the backend's errors of
  // the allocations.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& config, TrainerLink link, const Dataset* train,
      const Dataset* test, WorkerMetrics* metrics = nullptr,
      std::unique_ptr<DeviceBackend> backend = nullptr);
  // A flat worker on the CPU: Create(config, {client, nullptr}, train, test,
  // metrics).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& config, PsClient* client, const Dataset* train,
      const Dataset* test, WorkerMetrics* metrics = nullptr);

  // Rank 0 initialises the model from the job seed and pushes it (in a
  // node: local rank 0's, with PushNodeModel); every rank then pulls it, so
  // all start from the identical model. With checkpoint.resume instead:
  // ResumeFromCheckpoint. With cluster.admit_every_steps, in a job already
  // under way: RejoinRunningJob.
  absl::Status InitializeModel();
  // Takes this worker's rank back into the running elastic job at its next
  // admission step (AwaitAdmission, worker/trainer/rejoin.h) and starts
  // there from the servers' model, which that step's full average made
  // every member's, with zero algorithm state (momentum, residuals, error
  // buffers). AwaitAdmission's errors.
  absl::Status RejoinRunningJob();
  // Loads this process's file of the newest complete checkpoint of the job
  // (docs/reliability.md): the algorithm's state, the step and the epoch's
  // losses so far; then pulls the servers' model, which is that
  // checkpoint's. Errors: LoadNewestCheckpoint's, naming what was passed
  // over; FAILED_PRECONDITION when the servers resumed from another step;
  // DATA_LOSS naming the file when its sections do not fit the algorithm.
  absl::Status ResumeFromCheckpoint();
  // Runs the next step; returns its training loss.
  absl::StatusOr<float> Step();
  // After a step whose count is a multiple of checkpoint.every_steps or of
  // cluster.admit_every_steps (and not the last): settles the algorithm and
  // runs the full average (the error reset); at a checkpoint's step then
  // writes this process's file. A file that cannot be written is logged and
  // training goes on; that step's checkpoint stays incomplete. Run calls it
  // after each step's evaluation and progress line.
  absl::Status FullAverageIfDue();
  // Loss and accuracy of the local model on the test set. On a node a
  // collective: every local rank evaluates at the same point.
  absl::StatusOr<EvalSums> EvaluateTest();
  // After the last step: measures the local model, runs the algorithm's
  // final average and measures the servers' (global) model.
  absl::Status FinishTraining();
  // InitializeModel, then every epoch's steps with progress lines every
  // log_every_steps and a test evaluation at the end of each epoch; finally
  // writes <output_dir>/<SummaryBaseName>.json and .csv. A step that fails
  // because a server shard restarted from a checkpoint is followed by
  // RollBackIfAShardRestarted, and the epochs go on from there.
  absl::Status Run();
  // After a step failed with `failure`: when a shard restarted from a
  // checkpoint (checkpoints on, a flat worker, an algorithm that
  // rolls_back_in_place), every shard goes back to it in place and so does
  // this trainer (ResumeFromCheckpoint; the learning curve drops the steps
  // after it); true. False when no shard restarted (the failure stands).
  // FindRestartedShard's, RollBackShards' and ResumeFromCheckpoint's errors.
  absl::StatusOr<bool> RollBackIfAShardRestarted(const absl::Status& failure);

  // A host copy of the local model (waits for the backend).
  absl::StatusOr<std::vector<float>> Params();
  uint32_t rank() const { return plan_.rank; }
  uint32_t local_rank() const { return plan_.local_rank; }
  uint32_t partition() const { return plan_.partition; }
  uint64_t step() const { return step_; }
  // The step of the checkpoint this trainer resumed from; 0: none.
  uint64_t resumed_from_step() const { return resumed_from_; }
  // The admission step at which it rejoined a running job; 0: none.
  uint64_t joined_at_step() const { return joined_at_; }
  // How often it rolled back to a restarted shard's checkpoint.
  uint32_t roll_backs() const { return roll_backs_; }
  // Each change of the members the servers' rounds wait for (an elastic
  // job's dropped ranks), as the steps' replies said.
  const std::vector<MembershipChange>& membership() const { return membership_; }
  size_t steps_per_epoch() const { return plan_.steps_per_epoch; }
  const std::vector<CurvePoint>& curve() const { return curve_; }
  const FinalReport& final_report() const { return final_; }

 private:
  Trainer(const v1::JobConfig& config, TrainerLink link, TrainerPlan plan,
          const Dataset* train, const Dataset* test,
          std::unique_ptr<DeviceBackend> backend);
  absl::Status Init();
  absl::StatusOr<EvalSums> Evaluate(const float* params);
  // Steps times this process's shard floats over the training floats
  // pushed so far.
  double AchievedCompression() const;
  // The floats this process pushed in its training steps, each step once.
  uint64_t TrainingFloats() const;
  // Sleeps (slowdown - 1) x the compute time for a data.rank_slowdown of
  // more than 1, and refuses a diverged (non-finite) loss naming the rank
  // and step; passes on the backend's error.
  absl::Status EndCompute(absl::Time compute_start, const absl::StatusOr<float>& loss);
  // The epochs' steps, progress lines and evaluations (Run), from step_.
  absl::Status RunEpochs(absl::Time start);

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
  const float slowdown_;  // data.rank_slowdown of this partition, 1 = full speed
  WorkerMetrics* metrics_ = nullptr;  // null: no metrics
  std::unique_ptr<Algorithm> algorithm_;
  DeviceVector x_;     // of ops_
  DeviceVector grad_;  // of ops_
  uint64_t step_ = 0;
  uint64_t first_step_ = 0;  // this process's first step: resumed from or rejoined at
  uint64_t resumed_from_ = 0;
  uint64_t joined_at_ = 0;
  uint64_t followed_restart_ = 0;  // the restarted shard's incarnation last rolled back to
  uint32_t roll_backs_ = 0;
  // TrainingFloats as this process left each checkpoint it may roll back
  // to, and what it pushed for steps a roll back then trained again: not
  // counted, so that the figures are the uninterrupted job's.
  std::map<uint64_t, uint64_t> training_floats_at_;
  uint64_t floats_trained_again_ = 0;
  // The members the servers' rounds wait for, and each change of them.
  uint32_t members_ = 0;
  std::vector<MembershipChange> membership_;
  bool epoch_started_ = false;  // the batcher holds epoch step_ / steps_per_epoch's order
  // The training losses of the current epoch's steps so far, which a
  // checkpoint carries so that a resumed epoch's mean loss is the same.
  std::vector<float> epoch_losses_;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_TRAINER_H_
