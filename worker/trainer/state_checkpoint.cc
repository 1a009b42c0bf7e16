#include "worker/trainer/state_checkpoint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace cserps {

bool CheckpointDue(const v1::JobConfig& config, uint64_t step, uint64_t total_steps) {
  const uint32_t every = config.checkpoint().every_steps();
  return every != 0 && step % every == 0 && step < total_steps;
}

bool ResumesFromCheckpoint(const v1::JobConfig& config, const PsClient& client) {
  return config.checkpoint().resume() ||
         (config.checkpoint().restart_on_failure() && client.resumed_from_step() > 0);
}

absl::Status WriteStateCheckpoint(const v1::JobConfig& config, uint32_t partition,
                                  uint64_t step, Algorithm& algorithm, DeviceOps& ops,
                                  absl::Span<const float> epoch_losses,
                                  const std::string& log_prefix) {
  const std::vector<float*> buffers = algorithm.StateBuffers();
  std::vector<std::vector<float>> state(buffers.size(), std::vector<float>(ops.num_params()));
  for (size_t i = 0; i < buffers.size(); ++i) {
    RETURN_IF_ERROR(ops.Download(buffers[i], absl::MakeSpan(state[i])));
  }
  const absl::StatusOr<bool> completed =
      WriteRankCheckpoint(config, partition, step, state, epoch_losses);
  if (!completed.ok()) {
    spdlog::error("{}checkpoint of step {} not written: {}", log_prefix, step,
                  std::string(completed.status().message()));
  } else {
    spdlog::info("{}checkpoint of step {} written{}", log_prefix, step,
                 *completed ? " (step complete)" : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<RankCheckpoint> ResumeState(const v1::JobConfig& config, const PsClient& client,
                                           uint32_t partition, uint64_t steps_per_epoch,
                                           Algorithm& algorithm, DeviceOps& ops,
                                           const std::string& log_prefix) {
  const std::vector<float*> buffers = algorithm.StateBuffers();
  std::vector<std::string> passed_over;
  absl::StatusOr<RankCheckpoint> loaded = LoadRankCheckpoint(
      config, partition, buffers.size(), ops.num_params(), steps_per_epoch, &passed_over);
  for (const std::string& reason : passed_over) {
    spdlog::warn("{}passed over {}", log_prefix, reason);
  }
  if (!loaded.ok()) return loaded.status();
  if (client.resumed_from_step() != loaded->step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", partition, " resumes from the checkpoint of step ", loaded->step, " in ",
        config.checkpoint().dir(), " but the servers ",
        client.resumed_from_step() == 0
            ? std::string("started fresh")
            : absl::StrCat("resumed from step ", client.resumed_from_step()),
        ": start every server of the job with --resume and the same checkpoint.dir"));
  }
  RETURN_IF_ERROR(ForgetPartsAfter(CheckpointJob::Of(config), CheckpointRole::kRank, partition,
                                   loaded->step));
  for (size_t i = 0; i < buffers.size(); ++i) {
    RETURN_IF_ERROR(ops.Upload(loaded->state[i], buffers[i]));
  }
  RETURN_IF_ERROR(algorithm.ResumeAfter(loaded->step));
  spdlog::info("{}resumed from the checkpoint of step {} ({})", log_prefix, loaded->step,
               loaded->file);
  return loaded;
}

namespace {

// OK when none of `client`'s shards has completed a round.
absl::Status CheckServersStartedFresh(PsClient& client) {
  for (uint32_t s = 0; s < client.layout().num_shards(); ++s) {
    absl::StatusOr<v1::GetStatusResponse> status = client.GetStatus(s);
    if (absl::IsInvalidArgument(status.status())) continue;  // not this client's shard
    if (!status.ok()) return status.status();
    if (status->rounds_completed() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " is in the middle of the job (newest step ", status->newest_step(),
          ") and did not resume from a checkpoint: a restarted worker joins only servers "
          "restarted with it (checkpoint.restart_on_failure); they restart once their rounds "
          "fail"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StartWithoutCheckpoint(const v1::JobConfig& config, PsClient& client,
                                    uint32_t partition) {
  if (client.resumed_from_step() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", partition, " starts the job afresh but the servers resumed from the "
        "checkpoint of step ", client.resumed_from_step(), " in ", config.checkpoint().dir(),
        ": start every worker of the job with --resume (checkpoint.resume) too"));
  }
  if (config.checkpoint().restart_on_failure()) RETURN_IF_ERROR(CheckServersStartedFresh(client));
  if (config.checkpoint().every_steps() == 0) return absl::OkStatus();
  return ForgetPartsAfter(CheckpointJob::Of(config), CheckpointRole::kRank, partition, 0);
}

}  // namespace cserps
