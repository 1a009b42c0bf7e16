#include "worker/trainer/external_trainer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/algorithms/registry.h"
#include "worker/ps/node_client.h"
#include "worker/ps/worker_id.h"
#include "worker/trainer/state_checkpoint.h"
#include "worker/trainer/training_summary.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<ExternalTrainer>> ExternalTrainer::Create(
    const v1::JobConfig& config, const ExternalTrainerOptions& options,
    std::unique_ptr<DeviceOps> ops, std::unique_ptr<LocalGroup> group) {
  const uint32_t local_size = config.cluster().local_size();
  if (group == nullptr && local_size != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.local_size is ", local_size,
        ": this process is one local rank of a node, which needs its node's group"));
  }
  // The job's last step takes no checkpoint (its workers' final average
  // follows), which only the steps per epoch tell.
  if (config.checkpoint().every_steps() > 0 && options.steps_per_epoch == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.every_steps is ", config.checkpoint().every_steps(),
        ": the trainer needs its steps per epoch (steps_per_epoch), since the job's last step, "
        "epochs x steps per epoch, takes no checkpoint"));
  }
  if (config.cluster().admit_every_steps() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cluster.admit_every_steps is ", config.cluster().admit_every_steps(),
        ": the PyTorch front does not run the admission steps' full averages that "
        "cserps-workers of the job wait in, so leave it unset"));
  }
  if (config.algorithm().period_warmup_epochs() > 0 && options.steps_per_epoch == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "algorithm.period_warmup_epochs is ", config.algorithm().period_warmup_epochs(),
        ": it counts epochs, so the trainer needs its steps per epoch"));
  }
  ASSIGN_OR_RETURN(const ModelSpec spec, MakeModelSpec(config.model()));
  if (ops == nullptr) {
    ops = std::make_unique<HostDeviceOps>(spec.num_params, config.algorithm().block_size());
  }
  if (ops->num_params() != spec.num_params ||
      ops->block_size() != config.algorithm().block_size()) {
    return absl::InternalError("the device ops are not sized for the job");
  }
  PsClientOptions client_options;
  client_options.setup_timeout = options.setup_timeout;
  client_options.rpc_slack = options.rpc_slack;
  if (group != nullptr) {
    client_options.shard_stride = group->size();
    client_options.shard_offset = group->local_rank();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                   PsClient::Connect(config, spec.num_params, client_options));
  const std::string worker_id =
      options.worker_id.empty() ? DefaultWorkerId() : options.worker_id;
  const absl::StatusOr<uint32_t> rank =
      group == nullptr ? client->Register(options.requested_rank, worker_id)
                       : RegisterNode(*group, *client, options.requested_rank, worker_id);
  if (absl::IsDeadlineExceeded(rank.status())) {
    return absl::UnavailableError(absl::StrCat(
        "no answer from the servers within ", absl::FormatDuration(options.setup_timeout),
        " (are they running at the addresses of cluster.servers?): ",
        rank.status().message()));
  }
  RETURN_IF_ERROR(rank.status());
  std::unique_ptr<ExternalTrainer> trainer(new ExternalTrainer(
      config, options.steps_per_epoch, std::move(client), std::move(ops), std::move(group)));
  ASSIGN_OR_RETURN(trainer->plan_, PlanPlace(config, trainer->link()));
  AlgorithmContext context;
  context.config = &trainer->config_;
  context.comm = trainer->client_.get();
  context.ops = trainer->ops_.get();
  context.group = trainer->group_.get();
  context.weight = static_cast<float>(trainer->plan_.batch_size);
  context.steps_per_epoch = options.steps_per_epoch;
  ASSIGN_OR_RETURN(trainer->algorithm_, MakeAlgorithm(context));
  return trainer;
}

ExternalTrainer::ExternalTrainer(const v1::JobConfig& config, uint64_t steps_per_epoch,
                                 std::unique_ptr<PsClient> client, std::unique_ptr<DeviceOps> ops,
                                 std::unique_ptr<LocalGroup> group)
    : config_(config),
      steps_per_epoch_(steps_per_epoch),
      client_(std::move(client)),
      ops_(std::move(ops)),
      group_(std::move(group)) {}

absl::Status ExternalTrainer::CheckSize(size_t size, const char* what) const {
  if (size == num_params()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has ", size,
                                                 " floats but the job's model has ",
                                                 num_params(), " (model.num_params)"));
}

absl::Status ExternalTrainer::InitializeModel(absl::Span<float> params) {
  RETURN_IF_ERROR(CheckSize(params.size(), "the model"));
  std::vector<float> model(num_params());
  if (ResumesFromCheckpoint(config_, *client_)) {
    // The losses are the caller's: the files of this front hold none.
    absl::StatusOr<RankCheckpoint> loaded =
        ResumeState(config_, *client_, plan_.partition, /*steps_per_epoch=*/0, *algorithm_,
                    *ops_, plan_.log_prefix);
    RETURN_IF_ERROR(SharedStatus(link(), loaded.status(), "checkpoint resume"));
    step_ = first_step_ = loaded->step;
    RETURN_IF_ERROR(cserps::PullModel(link(), absl::MakeSpan(model), /*wait_for_init=*/false));
    return ops_->Upload(model, params.data());
  }
  RETURN_IF_ERROR(SharedStatus(link(), StartWithoutCheckpoint(config_, *client_, plan_.partition),
                               "fresh start"));
  if (rank() == 0) {
    RETURN_IF_ERROR(ops_->Download(params.data(), absl::MakeSpan(model)));
    RETURN_IF_ERROR(cserps::PushModel(link(), model));
  }
  RETURN_IF_ERROR(cserps::PullModel(link(), absl::MakeSpan(model), /*wait_for_init=*/true));
  return ops_->Upload(model, params.data());
}

absl::Status ExternalTrainer::Step(float lr, absl::Span<const float> grad,
                                   absl::Span<float> params) {
  RETURN_IF_ERROR(CheckSize(grad.size(), "the gradient"));
  RETURN_IF_ERROR(CheckSize(params.size(), "the model"));
  RETURN_IF_ERROR(algorithm_->Step(step_, lr, grad.data(), params.data()));
  ++step_;
  return CheckpointIfDue(params);
}

absl::Status ExternalTrainer::CheckpointIfDue(absl::Span<float> params) {
  if (!CheckpointDue(config_, step_, uint64_t{config_.epochs()} * steps_per_epoch_)) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(algorithm_->SettleForCheckpoint(params.data()));
  RETURN_IF_ERROR(algorithm_->AverageForCheckpoint(step_, params.data()));
  return WriteStateCheckpoint(config_, plan_.partition, step_, *algorithm_, *ops_,
                              /*epoch_losses=*/{}, plan_.log_prefix);
}

absl::Status ExternalTrainer::Finish(absl::Span<float> params) {
  RETURN_IF_ERROR(CheckSize(params.size(), "the model"));
  if (!training_floats_.has_value()) training_floats_ = TrainingFloatsPushed(*client_);
  return algorithm_->Finish(step_, params.data());
}

absl::Status ExternalTrainer::PullModel(absl::Span<float> out) {
  RETURN_IF_ERROR(CheckSize(out.size(), "the buffer"));
  return cserps::PullModel(link(), out, /*wait_for_init=*/false);
}

size_t ExternalTrainer::StateSize() { return algorithm_->StateBuffers().size(); }

absl::Status ExternalTrainer::SaveState(absl::Span<const float> params,
                                        absl::Span<const absl::Span<float>> out) {
  RETURN_IF_ERROR(CheckSize(params.size(), "the model"));
  const std::vector<float*> buffers = algorithm_->StateBuffers();
  if (out.size() != buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the algorithm's state has ", buffers.size(), " buffers, not ", out.size()));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    RETURN_IF_ERROR(CheckSize(out[i].size(), "a state buffer"));
  }
  RETURN_IF_ERROR(algorithm_->SettleForCheckpoint(params.data()));
  for (size_t i = 0; i < buffers.size(); ++i) {
    RETURN_IF_ERROR(ops_->Download(buffers[i], out[i]));
  }
  return absl::OkStatus();
}

absl::Status ExternalTrainer::LoadState(uint64_t step,
                                        absl::Span<const absl::Span<const float>> in) {
  const std::vector<float*> buffers = algorithm_->StateBuffers();
  if (in.size() != buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state has ", in.size(), " buffers but ", config_.algorithm().name(),
        " with this job's optimizer keeps ", buffers.size()));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    RETURN_IF_ERROR(CheckSize(in[i].size(), "a state buffer"));
  }
  // An average in flight from the steps before would land on the loaded
  // state at its period's end.
  algorithm_->AbandonInFlight();
  for (size_t i = 0; i < buffers.size(); ++i) RETURN_IF_ERROR(ops_->Upload(in[i], buffers[i]));
  RETURN_IF_ERROR(algorithm_->ResumeAfter(step));
  step_ = first_step_ = step;
  floats_before_first_step_ = TrainingFloatsPushed(*client_);
  training_floats_.reset();
  return absl::OkStatus();
}

double ExternalTrainer::achieved_compression() const {
  const uint64_t floats =
      training_floats_.value_or(TrainingFloatsPushed(*client_)) - floats_before_first_step_;
  return floats == 0 ? 0.0
                     : static_cast<double>(step_ - first_step_) * plan_.shard_floats / floats;
}

}  // namespace cserps
