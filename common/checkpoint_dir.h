// A job's checkpoints in one folder (docs/reliability.md): step-S/ holds
// the file of every shard and rank that step has (checkpoint_file.h) and,
// written last, MANIFEST, which names the job and lists the files. A step's
// checkpoint is complete when its manifest is there and every file it lists
// reads back whole.
#ifndef CSERPS_COMMON_CHECKPOINT_DIR_H_
#define CSERPS_COMMON_CHECKPOINT_DIR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/checkpoint_file.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// dir/step-00000000000000000300 (zero-padded: folders sort by step).
std::string CheckpointStepDir(const std::string& dir, uint64_t step);
// Inside it: shard-S.ckpt or rank-R.ckpt.
std::string CheckpointFileName(CheckpointRole role, uint32_t index);

// Creates step `step`'s folder (and `dir`) if needed.
absl::Status MakeCheckpointStepDir(const std::string& dir, uint64_t step);

// Marks step `step` complete: its manifest lists `files` (ids of files
// already written in its folder). Written atomically, last.
absl::Status WriteCheckpointManifest(const std::string& dir, uint64_t fingerprint,
                                     uint64_t step, absl::Span<const CheckpointId> files);

// The files of the newest complete checkpoint of job `fingerprint` in
// `dir`: every file its manifest lists, read and checked; those `wanted`
// (null: all) are kept. Every process of a job checks every file, so that
// all of them settle on the same step. Newer steps that are incomplete or
// damaged are passed over, each reason (naming the file and what is wrong)
// appended to `*passed_over`. NOT_FOUND when no step is complete (or `dir`
// does not exist), UNAVAILABLE when `dir` cannot be listed.
struct LoadedCheckpoint {
  uint64_t step = 0;
  std::vector<CheckpointId> ids;
  std::vector<std::vector<CheckpointSection>> files;  // by ids
};
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(
    const std::string& dir, uint64_t fingerprint, std::vector<std::string>* passed_over,
    const std::function<bool(const CheckpointId&)>& wanted = nullptr);

// Where a job's processes write their checkpoint files.
struct CheckpointJob {
  // The job's checkpoint.dir and keep, its fingerprint, shards and worker
  // processes (num_workers x local_size).
  static CheckpointJob Of(const v1::JobConfig& config);

  std::string dir;
  uint64_t fingerprint = 0;
  uint32_t num_shards = 0;
  uint32_t num_ranks = 0;  // worker processes
  uint32_t keep = 2;       // complete checkpoints kept
};

// Writes the file of `role` `index` for `step` into its folder. When every
// shard's and rank's file of the step is then there, writes the manifest
// and prunes to job.keep: the process that writes last completes the step
// (two that finish together write the same manifest). Returns whether this
// call found the step complete.
absl::StatusOr<bool> WriteCheckpointPart(const CheckpointJob& job, CheckpointRole role,
                                         uint32_t index, uint64_t step,
                                         absl::Span<const CheckpointSectionView> sections);

// Removes process `role` `index`'s file of job `job.fingerprint` from every
// step folder after `step`. A process that starts, or rolls back, from the
// checkpoint of `step` (0: none) will write those steps again: its file of
// an earlier run left there would count towards completing such a step (a
// step is complete once every process's file is there) next to the other
// processes' new ones. Files of other jobs, and those that do not read back
// whole, are left. UNAVAILABLE when job.dir cannot be listed or a file
// cannot be removed.
absl::Status ForgetPartsAfter(const CheckpointJob& job, CheckpointRole role, uint32_t index,
                              uint64_t step);

// Whether `dir` holds a manifest of job `fingerprint`, or one that cannot
// be read: a checkpoint of the job may have been completed there.
// UNAVAILABLE when `dir` cannot be listed (not a folder, say).
absl::StatusOr<bool> HasManifestOf(const std::string& dir, uint64_t fingerprint);

// Removes all but the newest `keep` complete checkpoints of job
// `fingerprint`, and incomplete steps older than the oldest kept; another
// job's steps and unreadable manifests stay.
absl::Status PruneCheckpoints(const std::string& dir, uint64_t fingerprint, uint32_t keep);

}  // namespace cserps

#endif  // CSERPS_COMMON_CHECKPOINT_DIR_H_
