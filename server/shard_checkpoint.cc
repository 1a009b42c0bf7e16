#include "server/shard_checkpoint.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace cserps {
namespace {

constexpr char kModelSection[] = "model";

}  // namespace

ShardCheckpoint::ShardCheckpoint(const v1::JobConfig& config, uint32_t shard, ShardStore* store)
    : job_(CheckpointJob::Of(config)),
      every_steps_(config.checkpoint().dir().empty() ? 0 : config.checkpoint().every_steps()),
      shard_(shard),
      store_(*store) {}

void ShardCheckpoint::AddSection(std::string name, std::function<std::vector<float>()> read) {
  sections_.emplace_back(std::move(name), std::move(read));
}

void ShardCheckpoint::ChunkApplied(uint64_t step, uint64_t floats) {
  {
    absl::MutexLock lock(&mu_);
    uint64_t& applied = applied_[step];
    applied += floats;
    if (applied < store_.size()) return;
    applied_.erase(step);
    newest_average_ = std::max(newest_average_, step);
  }
  if (every_steps_ == 0 || step % every_steps_ != 0) return;
  // Every member is still waiting for this round's last chunk, so no other
  // round changes the floats while they are read.
  std::vector<float> model(store_.size());
  absl::Status read = store_.Read(store_.first_float(), absl::MakeSpan(model));
  std::vector<std::vector<float>> others;
  std::vector<CheckpointSectionView> views = {{kModelSection, model}};
  for (const auto& [name, reader] : sections_) others.push_back(reader());
  for (size_t i = 0; i < sections_.size(); ++i) views.push_back({sections_[i].first, others[i]});
  absl::StatusOr<bool> completed =
      read.ok() ? WriteCheckpointPart(job_, CheckpointRole::kShard, shard_, step, views)
                : absl::StatusOr<bool>(read);
  if (!completed.ok()) {
    spdlog::error("shard {}: checkpoint of step {} not written: {}", shard_, step,
                  std::string(completed.status().message()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++written_;
  }
  spdlog::info("shard {}: checkpoint of step {} written{}", shard_, step,
               *completed ? " (step complete)" : "");
}

uint64_t ShardCheckpoint::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

void ShardCheckpoint::RollBack(uint64_t step) {
  absl::MutexLock lock(&mu_);
  applied_.clear();
  newest_average_ = step;
}

uint64_t ShardCheckpoint::newest_full_average_step() const {
  absl::MutexLock lock(&mu_);
  return newest_average_;
}

absl::StatusOr<ResumedShard> ResumeShard(const v1::JobConfig& config, uint32_t shard,
                                         ShardStore* store) {
  const CheckpointJob job = CheckpointJob::Of(config);
  std::vector<std::string> passed_over;
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadNewestCheckpoint(job.dir, job.fingerprint, &passed_over, [shard](const CheckpointId& id) {
        return id.role == CheckpointRole::kShard && id.index == shard;
      });
  for (const std::string& reason : passed_over) {
    spdlog::warn("shard {}: passed over {}", shard, reason);
  }
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("shard ", shard, " cannot resume: ", loaded.status().message(),
                                     passed_over.empty() ? "" : " (passed over: ",
                                     absl::StrJoin(passed_over, "; "),
                                     passed_over.empty() ? "" : ")"));
  }
  std::vector<CheckpointSection>* sections = loaded->files.empty() ? nullptr : &loaded->files[0];
  const CheckpointSection* model = nullptr;
  if (sections != nullptr) {
    for (const CheckpointSection& s : *sections) {
      if (s.name == kModelSection) model = &s;
    }
  }
  const std::string file =
      CheckpointStepDir(job.dir, loaded->step) + "/" + CheckpointFileName(CheckpointRole::kShard, shard);
  if (sections == nullptr) {
    return absl::DataLossError(absl::StrCat("checkpoint of step ", loaded->step, " in ", job.dir,
                                            ": its manifest does not list shard ", shard));
  }
  if (model == nullptr || model->values.size() != store->size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", file, ": ",
        model == nullptr ? std::string("no section 'model'")
                         : absl::StrCat("section 'model' holds ", model->values.size(),
                                        " floats, shard ", shard, " has ", store->size())));
  }
  absl::StatusOr<bool> initialised = store->Write(store->first_float(), model->values);
  if (!initialised.ok()) return initialised.status();
  spdlog::info("shard {}: resumed from the checkpoint of step {} ({})", shard, loaded->step, file);
  ResumedShard resumed;
  resumed.step = loaded->step;
  for (CheckpointSection& s : *sections) {
    if (s.name != kModelSection) resumed.sections.push_back(std::move(s));
  }
  return resumed;
}

}  // namespace cserps
