// The worker's training loop: data shard, model forward/backward, the
// algorithm's step, evaluation, progress lines and the run's outputs.
//
// A trainer is one process of the job (a thread, for local ranks run as
// threads): flat, it is a member of its own; in a node of
// cluster.local_size = L > 1 processes it is one local rank, and the node is
// the member (worker/hierarchical_communicator.h). Either way it trains on
// its own data partition with its own batch size and writes its own
// summary.
#ifndef CSERPS_WORKER_TRAINER_H_
#define CSERPS_WORKER_TRAINER_H_

#include <cstdint>
#include <functional>
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
#include "worker/group/local_group.h"
#include "worker/hierarchical_communicator.h"
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

// How a trainer reaches the servers. Both pointers outlive the trainer.
struct TrainerLink {
  // This process's client, registered: client->rank() is the member's rank
  // (the node's, in a node). In a node it covers only this local rank's
  // shards (PsClientOptions::shard_stride = L, shard_offset = local rank)
  // and was registered with RegisterNode. The summary and the metrics report
  // its traffic: this process's share of the node's.
  PsClient* client = nullptr;
  // This process's member of its node's group, whose size must be
  // cluster.local_size; null for a flat worker (cluster.local_size 1). With
  // a group, the trainer averages through a HierarchicalCommunicator over
  // `group` and `client`, and every local rank of the node must drive its
  // trainer through the same calls in the same order (they are collectives).
  LocalGroup* group = nullptr;
};

// What both trainers (this one and worker/device/device_trainer.h) derive
// from the job, their link and the training set's size.
struct TrainerPlan {
  uint32_t rank = 0;        // the member's (the node's, in a node)
  uint32_t local_rank = 0;  // 0 for a flat worker
  uint32_t partition = 0;   // DataPartition(rank, local_rank, local_size)
  uint32_t batch_size = 0;  // the partition's, also its weight in averages
  size_t steps_per_epoch = 0;
  Range range;  // the partition's examples
  // Floats of the shards this process talks to (all d when flat): what its
  // achieved compression is measured against.
  uint64_t shard_floats = 0;
  std::string log_prefix;  // "local rank j: " in a node
};
// FAILED_PRECONDITION naming cluster.local_size when the link's group (or
// its absence) does not match it; INVALID_ARGUMENT for a rank not below
// num_workers, a partition the config has no batch size for, or too few
// examples for one step.
absl::StatusOr<TrainerPlan> PlanTrainer(const v1::JobConfig& config, const TrainerLink& link,
                                        size_t train_size);

// The whole model to or from the servers through `link`: the client's
// calls, or in a node the group's (PushNodeModel, PullNodeModel; every
// local rank calls them).
absl::Status PushModel(const TrainerLink& link, absl::Span<const float> model);
absl::Status PullModel(const TrainerLink& link, absl::Span<float> model, bool wait_for_init);

// The data partition of local rank `local_rank` of the node (or flat
// worker, local_size 1) of rank `rank`: rank * local_size + local_rank. The
// training set is split into num_workers * local_size partitions, one per
// process, in proportion to RankBatchSizes (one entry per process), and
// data.rank_slowdown is indexed the same way.
uint32_t DataPartition(uint32_t rank, uint32_t local_rank, uint32_t local_size);

// The reporting every training loop shares (this Trainer and the device
// trainer, worker/device/device_trainer.h).

// correct / count of `sums` (0 for no examples).
double Accuracy(const EvalSums& sums);
// "worker_<rank>", or "worker_<rank>_<local_rank>" when local_size > 1.
std::string SummaryBaseName(const v1::JobConfig& config, uint32_t rank,
                            uint32_t local_rank);
// PushPull and sparse floats `client` pushed so far, over every stream.
uint64_t TrainingFloatsPushed(const PsClient& client);

// Sets `metrics`' per-stream byte counters from the client's totals (model
// pushes and pulls count as "other").
void ReportTraffic(const PsClient& client, WorkerMetrics* metrics);

// After a step's loss and gradient, for both trainers: sleeps
// (slowdown - 1) x the compute time when slowdown > 1 (data.rank_slowdown's
// slower device), and refuses a diverged (non-finite) loss naming the rank
// and step. In a node (link.group set) the local ranks share that verdict
// (ShareStatus, a collective every step), so that the peers of a diverged
// local rank fail with it at once instead of waiting for it in the step's
// first average until the group's timeout.
absl::Status EndCompute(float slowdown, absl::Time compute_start, float loss,
                        const TrainerLink& link, uint64_t step);

// One step's timing, as the worker metrics split it: compute until the
// algorithm starts; communication, the time blocked on the servers since
// then (the client's wait time grows by it); update, the rest.
struct StepTiming {
  absl::Time compute_start;
  absl::Time algorithm_start;
  absl::Duration waited_before;  // client.wait_time() at algorithm_start
};
// Records a finished step in `metrics`: its phases, batch size, loss and
// learning rate, the traffic and the compression.
void RecordStep(WorkerMetrics& metrics, const PsClient& client, const StepTiming& timing,
                uint32_t batch_size, float loss, float lr, double compression);

// What the epoch loop of both trainers (host and device) needs; every
// pointer is valid during RunEpochs.
struct EpochLoop {
  const v1::JobConfig* config = nullptr;
  const PsClient* client = nullptr;
  const LrSchedule* schedule = nullptr;
  size_t steps_per_epoch = 0;
  uint32_t batch_size = 0;
  std::string log_prefix;
};
// config.epochs() epochs of steps_per_epoch calls of `step` (which runs the
// next step and returns its loss), a progress line every
// config.log_every_steps() steps, and after each epoch `evaluate` on the
// test set, appended to `curve` as the epoch's learning-curve row (wall time
// counted from `start`). The first error ends the loop.
absl::Status RunEpochs(const EpochLoop& loop, absl::Time start,
                       const std::function<absl::StatusOr<float>()>& step,
                       const std::function<absl::StatusOr<EvalSums>()>& evaluate,
                       std::vector<CurvePoint>* curve);
// The run's closing line: local and global accuracy, achieved compression.
void LogFinal(const std::string& log_prefix, const FinalReport& report);
// What a run's summary reports; every pointer is valid during the call.
struct TrainingSummary {
  const v1::JobConfig* config = nullptr;
  const PsClient* client = nullptr;
  uint32_t rank = 0;
  uint32_t local_rank = 0;
  uint64_t num_params = 0;
  uint64_t steps = 0;
  uint32_t batch_size = 0;
  const std::vector<CurvePoint>* curve = nullptr;
  const FinalReport* final_report = nullptr;
  double wall_seconds = 0;
};
// Writes <output_dir>/<SummaryBaseName>.csv (the curve) and .json.
// PERMISSION_DENIED naming output_dir when it cannot be created; DATA_LOSS
// naming the file when a write fails.
absl::Status WriteTrainingSummary(const TrainingSummary& summary);

class Trainer {
 public:
  // `config` has defaults applied and is valid; `train` and `test` outlive
  // the trainer. With `metrics` (which outlives the trainer too), every step
  // and evaluation updates it; nullptr: no metrics. `model` computes the
  // loss and gradients (a CUDA model, say); nullptr: the CPU model of
  // config.model. Errors: FAILED_PRECONDITION naming cluster.local_size when
  // the link's group (or its absence) does not match it; INVALID_ARGUMENT
  // for a rank or partition the config has no batch size for, too few
  // examples for one step, or a model that does not fit the data.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& config, TrainerLink link, const Dataset* train,
      const Dataset* test, WorkerMetrics* metrics = nullptr,
      std::unique_ptr<Model> model = nullptr);
  // A flat worker: Create(config, {client, nullptr}, train, test, metrics).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const v1::JobConfig& config, PsClient* client, const Dataset* train,
      const Dataset* test, WorkerMetrics* metrics = nullptr);

  // Rank 0 initialises the model from the job seed and pushes it (in a
  // node: local rank 0's, with PushNodeModel); every rank then pulls it, so
  // all start from the identical model.
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
  // writes <output_dir>/<SummaryBaseName()>.json and .csv.
  absl::Status Run();

  // "worker_<rank>", or "worker_<rank>_<local_rank>" when local_size > 1.
  std::string SummaryBaseName() const;

  uint32_t rank() const { return plan_.rank; }
  uint32_t local_rank() const { return plan_.local_rank; }
  uint32_t partition() const { return plan_.partition; }
  absl::Span<const float> params() const { return x_; }
  uint64_t step() const { return step_; }
  size_t steps_per_epoch() const { return plan_.steps_per_epoch; }
  const std::vector<CurvePoint>& curve() const { return curve_; }
  const FinalReport& final_report() const { return final_; }

 private:
  Trainer(const v1::JobConfig& config, TrainerLink link, TrainerPlan plan,
          const Dataset* train, const Dataset* test, std::unique_ptr<Model> model);
  absl::Status WriteOutputs(double wall_seconds) const;
  // S-SGD's floats for this process's shards over the steps so far, over
  // `floats_pushed`.
  double AchievedCompression(uint64_t floats_pushed) const;
  EvalSums Evaluate(absl::Span<const float> params);

  const v1::JobConfig config_;
  const TrainerLink link_;
  const TrainerPlan plan_;
  PsClient* const client_;
  // In a node, what the algorithm averages through; declared before
  // algorithm_, which uses it until destroyed.
  std::unique_ptr<HierarchicalCommunicator> hierarchical_;
  Communicator* comm_ = nullptr;  // client_ or hierarchical_
  const Dataset* const test_;
  std::unique_ptr<Model> model_;
  EpochBatcher batcher_;
  Direction direction_;
  LrSchedule schedule_;
  std::unique_ptr<Algorithm> algorithm_;
  const float slowdown_;  // data.rank_slowdown of this partition, 1 = full speed
  std::vector<float> x_;
  std::vector<float> grad_;
  uint64_t step_ = 0;
  std::vector<CurvePoint> curve_;
  FinalReport final_;
  WorkerMetrics* metrics_ = nullptr;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_H_
