// A worker whose model its caller computes: the PyTorch front
// (python/cserps) computes each step's gradient in torch and hands it here
// with the parameters, as buffers of the job's d floats laid out as
// docs/protocol.md says ("Model layout"; FLAT: the caller's order), in the
// memory of the trainer's DeviceOps (host memory, or a GPU's with the CUDA
// device ops). The step itself (direction, local update, the exchanges with
// the servers) is the job's algorithm, the same code cserps-worker runs.
//
// Not thread-safe: one thread at a time.
#ifndef CSERPS_WORKER_TRAINER_EXTERNAL_TRAINER_H_
#define CSERPS_WORKER_TRAINER_EXTERNAL_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "worker/algorithms/algorithm.h"
#include "worker/device/host_device_ops.h"
#include "worker/group/local_group.h"
#include "worker/ps/ps_client.h"
#include "worker/trainer/trainer_plan.h"

namespace cserps {

struct ExternalTrainerOptions {
  // The rank to claim; -1 lets shard 0 assign the lowest free one.
  int requested_rank = -1;
  std::string worker_id;  // empty: DefaultWorkerId()
  // Deadline of Register and the model's push and pull, which wait for the
  // servers to come up and for rank 0 to initialise the model.
  absl::Duration setup_timeout = absl::Seconds(120);
  // How much longer than cluster.round_timeout_s a step's exchange may wait
  // for the servers before it fails with DEADLINE_EXCEEDED.
  absl::Duration rpc_slack = absl::Seconds(30);
  // Steps per epoch, for algorithm fields counted in epochs
  // (algorithm.period_warmup_epochs); 0: the job has none.
  uint64_t steps_per_epoch = 0;
};

class ExternalTrainer {
 public:
  // Connects to the servers of `config` (defaults applied, valid) and
  // registers: as a worker of its own, or with `group` as one local rank of
  // a node (cluster.local_size = the group's size), whose local ranks all
  // create their trainers alike, with the node's rank to claim and node id
  // as worker_id, and then make every call below together (they are
  // collectives of the group), except LoadState and the getters.
  // A local rank that fails or ends fails the others in their next
  // collective (at once with a SocketGroup, else at the group's timeout).
  // Errors: FAILED_PRECONDITION for cluster.local_size > 1 without a group
  // or with one of another size, an algorithm field counted in epochs or
  // checkpoint.every_steps without steps_per_epoch, or
  // cluster.admit_every_steps; UNAVAILABLE for servers that
  // do not answer Register within setup_timeout; Register's (FAILED_PRECONDITION
  // naming the first field where the servers' job differs);
  // INVALID_ARGUMENT for a rank not below cluster.num_workers;
  // MakeAlgorithm's (NOT_FOUND listing the known names).
  // `ops` (null: HostDeviceOps) must be sized for the job's model and
  // block size; params and grad below are buffers of its memory.
  static absl::StatusOr<std::unique_ptr<ExternalTrainer>> Create(
      const v1::JobConfig& config, const ExternalTrainerOptions& options = {},
      std::unique_ptr<DeviceOps> ops = nullptr, std::unique_ptr<LocalGroup> group = nullptr);

  // Rank 0 pushes `params` as the job's initial model; every rank then
  // waits for it and pulls it into `params`, so all start alike. Waits for
  // the ops. A job resuming from its checkpoints (checkpoint.resume, or
  // checkpoint.restart_on_failure with servers that resumed) instead takes
  // this process's state from the newest complete one in checkpoint.dir and
  // the model from the servers, and step() is then that checkpoint's step,
  // where the caller's training goes on (ResumeState's errors). A worker
  // that starts afresh with servers that did not fails
  // (StartWithoutCheckpoint).
  absl::Status InitializeModel(absl::Span<float> params);
  // Step step() of the algorithm at learning rate `lr`: `grad` is the
  // stochastic gradient at `params`, which the step updates in place. Both
  // are d floats and must stay where they are until Finish: an average
  // the algorithm leaves in flight lands in `params` at a later step. The
  // update may still be queued on the ops' stream when it returns. With
  // checkpoint.every_steps, a step that ends on a multiple of it (but the
  // job's last, epochs x steps_per_epoch) is followed by the checkpoint's
  // full average and this process's file of it (docs/reliability.md), as
  // cserps-worker's steps are, so both kinds of worker can share a job.
  absl::Status Step(float lr, absl::Span<const float> grad, absl::Span<float> params);
  // After the last step: the algorithm's final average, after which every
  // worker's `params` and the servers hold the same global model.
  absl::Status Finish(absl::Span<float> params);
  // The servers' model, into host memory.
  absl::Status PullModel(absl::Span<float> out);

  // A checkpoint of the algorithm after step() steps: how many model-sized
  // buffers its state has, and copies of them (Algorithm::StateBuffers)
  // after it has landed what it keeps in flight between steps, which waits
  // for the servers (on a node a collective, like the steps); `params` are
  // the model's, as at the last step. LoadState puts such copies back, with
  // the step count of them; INVALID_ARGUMENT when their count or sizes do
  // not match. The copies are in host memory.
  size_t StateSize();
  absl::Status SaveState(absl::Span<const float> params,
                         absl::Span<const absl::Span<float>> out);
  absl::Status LoadState(uint64_t step, absl::Span<const absl::Span<const float>> in);

  // The member's rank (the node's, in a node).
  uint32_t rank() const { return plan_.rank; }
  uint32_t local_rank() const { return plan_.local_rank; }
  // This process's index among the job's num_workers x local_size, which
  // the per-process lists (data.rank_batch_sizes, ...) are indexed by.
  uint32_t partition() const { return plan_.partition; }
  uint64_t num_params() const { return ops_->num_params(); }
  uint64_t step() const { return step_; }
  // The weight of this process in averages: its batch size in the job
  // (data.batch_size, or its entry of the per-process lists).
  float weight() const { return static_cast<float>(plan_.batch_size); }
  // Steps times the floats of this process's shards (all d when flat) over
  // the training floats it pushed so far (S-SGD: 1); after Finish, those of
  // the steps alone, as cserps-worker's summary reports. In a resumed job,
  // of the steps since the resume; after LoadState, since the load.
  double achieved_compression() const;
  // This process's client: in a node, of this local rank's shards only.
  const PsClient& client() const { return *client_; }

 private:
  ExternalTrainer(const v1::JobConfig& config, uint64_t steps_per_epoch,
                  std::unique_ptr<PsClient> client, std::unique_ptr<DeviceOps> ops,
                  std::unique_ptr<LocalGroup> group);
  TrainerLink link() const { return {client_.get(), group_.get()}; }
  // The checkpoint after step step(), when one is due (Step).
  absl::Status CheckpointIfDue(absl::Span<float> params);
  // `d` floats, or INVALID_ARGUMENT naming `what`.
  absl::Status CheckSize(size_t size, const char* what) const;

  const v1::JobConfig config_;
  const uint64_t steps_per_epoch_;  // 0: not known (the job has no checkpoints)
  const std::unique_ptr<PsClient> client_;
  const std::unique_ptr<DeviceOps> ops_;
  const std::unique_ptr<LocalGroup> group_;  // null: a flat worker
  TrainerPlan plan_;
  std::unique_ptr<Algorithm> algorithm_;  // on ops_, client_ and group_
  uint64_t step_ = 0;
  // The step achieved_compression counts from: a resumed or loaded state's,
  // and the training floats this process pushed before it.
  uint64_t first_step_ = 0;
  uint64_t floats_before_first_step_ = 0;
  // The training floats pushed before Finish; unset until then.
  std::optional<uint64_t> training_floats_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_EXTERNAL_TRAINER_H_
