// A shard's part in the job's full averages: its checkpoints and an elastic
// job's admission steps (docs/reliability.md). When every chunk of a step's
// CHECKPOINT round has been applied, the shard's floats are that step's
// global model: at a checkpoint's step it writes them as its file of the
// step, and completes the step when it writes last. With checkpoint.resume
// it starts from the newest complete checkpoint instead of waiting for
// PushModel.
//
// Thread safety: ChunkApplied may be called from any thread.
#ifndef CSERPS_SERVER_SHARD_CHECKPOINT_H_
#define CSERPS_SERVER_SHARD_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/checkpoint_dir.h"
#include "cserps/v1/config.pb.h"
#include "server/shard_store.h"

namespace cserps {

class ShardCheckpoint {
 public:
  // `store` outlives it.
  ShardCheckpoint(const v1::JobConfig& config, uint32_t shard, ShardStore* store);

  // Another service's state, saved with the model as section `name` (read
  // by `read` while the checkpoint round's members wait). Call before the
  // first round.
  void AddSection(std::string name, std::function<std::vector<float>()> read);

  // `floats` of step `step`'s CHECKPOINT round have been applied to the
  // store; the call that brings the step to the shard's size writes the
  // file of a checkpoint's step, before the round's members are answered.
  // A write that fails is logged: the step stays incomplete and training
  // goes on.
  void ChunkApplied(uint64_t step, uint64_t floats);

  // Checkpoints written by this shard.
  uint64_t written() const;
  // Newest step whose full average covers the shard; 0: none yet.
  uint64_t newest_full_average_step() const;
  // The shard went back to the checkpoint of `step`: the averages of later
  // steps, complete or not, are forgotten.
  void RollBack(uint64_t step);

 private:
  const CheckpointJob job_;
  const uint32_t every_steps_;  // checkpoint.every_steps, with a folder; 0: none
  const uint32_t shard_;
  ShardStore& store_;
  std::vector<std::pair<std::string, std::function<std::vector<float>()>>> sections_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> applied_ ABSL_GUARDED_BY(mu_);  // floats by step
  uint64_t newest_average_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
};

// Loads shard `shard`'s floats of the newest complete checkpoint of the job
// in checkpoint.dir into `store` (initialising it) and returns its step and
// the file's other sections (AddSection's). Newer steps passed over are
// logged with their reasons; NOT_FOUND (with them) when no step is
// complete, DATA_LOSS naming the file when it holds no model of the
// shard's size.
struct ResumedShard {
  uint64_t step = 0;
  std::vector<CheckpointSection> sections;
};
absl::StatusOr<ResumedShard> ResumeShard(const v1::JobConfig& config, uint32_t shard,
                                         ShardStore* store);

// A roll back's load of the shard's checkpoint (its services' rounds
// stopped): the model goes into the store, the file's other sections are
// answered.
using CheckpointReload = std::function<absl::StatusOr<std::vector<CheckpointSection>>()>;

}  // namespace cserps

#endif  // CSERPS_SERVER_SHARD_CHECKPOINT_H_
