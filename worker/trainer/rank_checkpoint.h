// A worker process's file of the job's checkpoints (docs/reliability.md):
// its algorithm's state buffers (Algorithm::StateBuffers, momentum first)
// and the training losses of the epoch so far. The model is not in it:
// after the checkpoint's average every local model is the servers'.
#ifndef CSERPS_WORKER_TRAINER_RANK_CHECKPOINT_H_
#define CSERPS_WORKER_TRAINER_RANK_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// Writes process `partition`'s file of step `step`: `state` (each of d
// floats) and `epoch_losses`; completes the step when it is the last file
// (WriteCheckpointPart). Returns whether it did.
absl::StatusOr<bool> WriteRankCheckpoint(const v1::JobConfig& config, uint32_t partition,
                                         uint64_t step,
                                         const std::vector<std::vector<float>>& state,
                                         absl::Span<const float> epoch_losses);

struct RankCheckpoint {
  uint64_t step = 0;
  std::string file;  // for messages
  std::vector<std::vector<float>> state;
  std::vector<float> epoch_losses;
};

// Process `partition`'s file of the newest complete checkpoint of the job
// in checkpoint.dir (every file of it checked, so that every process
// settles on the same step), holding `state_buffers` buffers of `d` floats
// and the losses of the steps it trained of its epoch: those done
// (`steps_per_epoch`; 0: a worker that keeps no losses, the PyTorch front,
// whose files hold none), or fewer when it rejoined the job in the epoch.
// Newer steps passed over are appended to `*passed_over`. Errors:
// LoadNewestCheckpoint's, naming the process and what was passed over;
// DATA_LOSS naming the file when its sections do not fit; FAILED_PRECONDITION
// when its step is not before the job's end (with `steps_per_epoch` > 0).
absl::StatusOr<RankCheckpoint> LoadRankCheckpoint(const v1::JobConfig& config,
                                                  uint32_t partition, size_t state_buffers,
                                                  uint64_t d, uint64_t steps_per_epoch,
                                                  std::vector<std::string>* passed_over);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_RANK_CHECKPOINT_H_
