// A worker's part of the job's checkpoints (docs/reliability.md), shared by
// cserps-worker's trainer and the PyTorch front's: after a checkpoint's
// average, this process's file with its algorithm's state; at a resume, that
// state back into the algorithm, from the step the servers resumed from.
#ifndef CSERPS_WORKER_TRAINER_STATE_CHECKPOINT_H_
#define CSERPS_WORKER_TRAINER_STATE_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cserps/v1/config.pb.h"
#include "worker/algorithms/algorithm.h"
#include "worker/device/device_ops.h"
#include "worker/ps/ps_client.h"
#include "worker/trainer/rank_checkpoint.h"

namespace cserps {

// Whether the job takes a checkpoint after step `step`: a multiple of
// checkpoint.every_steps, but not the last of `total_steps` (the workers'
// final average follows it).
bool CheckpointDue(const v1::JobConfig& config, uint64_t step, uint64_t total_steps);

// Whether this process starts from the job's newest checkpoint:
// checkpoint.resume, or a restart (checkpoint.restart_on_failure) whose
// servers resumed from one.
bool ResumesFromCheckpoint(const v1::JobConfig& config, const PsClient& client);

// Writes process `partition`'s file of step `step`'s checkpoint, taken after
// the checkpoint's average: `algorithm`'s state buffers (in `ops`' memory)
// and `epoch_losses`. A file that cannot be written is logged and training
// goes on (that step then never completes); only reading the buffers back
// fails the call.
absl::Status WriteStateCheckpoint(const v1::JobConfig& config, uint32_t partition,
                                  uint64_t step, Algorithm& algorithm, DeviceOps& ops,
                                  absl::Span<const float> epoch_losses,
                                  const std::string& log_prefix);

// Loads process `partition`'s file of the newest complete checkpoint in
// checkpoint.dir (LoadRankCheckpoint, with `steps_per_epoch`), checks that
// `client`'s servers resumed from the same step, removes the process's
// files of later steps (ForgetPartsAfter), and puts its state into
// `algorithm`'s buffers (ResumeAfter its step). The model is the servers'
// and is not loaded here. Errors: LoadRankCheckpoint's; FAILED_PRECONDITION
// naming both steps when the servers resumed from another (or started
// fresh).
absl::StatusOr<RankCheckpoint> ResumeState(const v1::JobConfig& config, const PsClient& client,
                                           uint32_t partition, uint64_t steps_per_epoch,
                                           Algorithm& algorithm, DeviceOps& ops,
                                           const std::string& log_prefix);

// Process `partition` starts the job without a checkpoint. Refused
// (FAILED_PRECONDITION, naming the step) when `client`'s servers resumed
// from one, and under checkpoint.restart_on_failure when a shard has
// completed a round: a worker starts afresh only with servers that did.
// Then its files of an earlier run in checkpoint.dir are removed
// (ForgetPartsAfter step 0), so never those of the checkpoints the servers
// resumed from.
absl::Status StartWithoutCheckpoint(const v1::JobConfig& config, PsClient& client,
                                    uint32_t partition);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_STATE_CHECKPOINT_H_
