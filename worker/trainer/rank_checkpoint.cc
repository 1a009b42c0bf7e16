#include "worker/trainer/rank_checkpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_dir.h"

namespace cserps {
namespace {

constexpr char kEpochLossesSection[] = "epoch_losses";
std::string StateSection(size_t i) { return absl::StrCat("state-", i); }

}  // namespace

absl::StatusOr<bool> WriteRankCheckpoint(const v1::JobConfig& config, uint32_t partition,
                                         uint64_t step,
                                         const std::vector<std::vector<float>>& state,
                                         absl::Span<const float> epoch_losses) {
  std::vector<std::string> names;
  for (size_t i = 0; i < state.size(); ++i) names.push_back(StateSection(i));
  std::vector<CheckpointSectionView> sections;
  for (size_t i = 0; i < state.size(); ++i) sections.push_back({names[i], state[i]});
  sections.push_back({kEpochLossesSection, epoch_losses});
  return WriteCheckpointPart(CheckpointJob::Of(config), CheckpointRole::kRank, partition, step,
                             sections);
}

absl::StatusOr<RankCheckpoint> LoadRankCheckpoint(const v1::JobConfig& config,
                                                  uint32_t partition, size_t state_buffers,
                                                  uint64_t d, uint64_t steps_per_epoch,
                                                  std::vector<std::string>* passed_over) {
  const CheckpointJob job = CheckpointJob::Of(config);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(
      job.dir, job.fingerprint, passed_over, [partition](const CheckpointId& id) {
        return id.role == CheckpointRole::kRank && id.index == partition;
      });
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("rank ", partition, " cannot resume: ",
                                     loaded.status().message(),
                                     passed_over->empty() ? "" : " (passed over: ",
                                     absl::StrJoin(*passed_over, "; "),
                                     passed_over->empty() ? "" : ")"));
  }
  const uint64_t total = uint64_t{config.epochs()} * steps_per_epoch;
  // None is written at the job's end: this job's steps per epoch differ
  // from the writer's (the training data or a batch size, which the job's
  // fingerprint leaves out), or the file lies.
  if (steps_per_epoch > 0 && loaded->step >= total) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", partition, " cannot resume from the checkpoint of step ", loaded->step, " in ",
        job.dir, ": this job ends at step ", total, " (", config.epochs(), " epochs of ",
        steps_per_epoch, " steps); did the training data or a batch size change since it was "
        "written?"));
  }
  RankCheckpoint checkpoint;
  checkpoint.step = loaded->step;
  checkpoint.file = absl::StrCat(CheckpointStepDir(job.dir, loaded->step), "/",
                                 CheckpointFileName(CheckpointRole::kRank, partition));
  if (loaded->files.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint of step ", loaded->step, " in ", job.dir,
                                            ": its manifest does not list rank ", partition));
  }
  std::vector<CheckpointSection>& sections = loaded->files[0];
  auto find = [&](const std::string& name) -> CheckpointSection* {
    for (CheckpointSection& s : sections) {
      if (s.name == name) return &s;
    }
    return nullptr;
  };
  auto damaged = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", checkpoint.file, ": ", what, " (",
                                            config.algorithm().name(), " keeps ", state_buffers,
                                            " state buffers)"));
  };
  if (find(StateSection(state_buffers)) != nullptr) return damaged("more state buffers");
  for (size_t i = 0; i < state_buffers; ++i) {
    CheckpointSection* state = find(StateSection(i));
    if (state == nullptr) return damaged(absl::StrCat("no section '", StateSection(i), "'"));
    if (state->values.size() != d) {
      return damaged(absl::StrCat("section '", StateSection(i), "' holds ", state->values.size(),
                                  " floats, not ", d));
    }
    checkpoint.state.push_back(std::move(state->values));
  }
  CheckpointSection* losses = find(kEpochLossesSection);
  const uint64_t done = steps_per_epoch == 0 ? 0 : loaded->step % steps_per_epoch;
  // Fewer: the process rejoined the job (elastic) in this epoch.
  if (losses == nullptr || losses->values.size() > done) {
    std::string what = "is missing";
    if (losses != nullptr && steps_per_epoch == 0) {
      what = absl::StrCat("holds ", losses->values.size(),
                          " losses, but this worker (the PyTorch front) keeps none: the file "
                          "is a cserps-worker's");
    } else if (losses != nullptr) {
      what = absl::StrCat("holds ", losses->values.size(), " losses, more than the ", done,
                          " steps done of epoch ", loaded->step / steps_per_epoch + 1, " at ",
                          steps_per_epoch, " steps per epoch (did the training data or a batch "
                          "size change since it was written?)");
    }
    return absl::DataLossError(absl::StrCat("checkpoint file ", checkpoint.file, ": section '",
                                            kEpochLossesSection, "' ", what));
  }
  checkpoint.epoch_losses = std::move(losses->values);
  return checkpoint;
}

}  // namespace cserps
