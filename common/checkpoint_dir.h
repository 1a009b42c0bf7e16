// A job's checkpoints in one folder (docs/reliability.md): step-S/ holds
// the file of every shard and rank that step has (checkpoint_file.h) and,
// written last, MANIFEST, which names the job and lists the files. A step's
// checkpoint is complete when its manifest is there and every file it lists
// reads back whole.
#ifndef CSERPS_COMMON_CHECKPOINT_DIR_H_
#define CSERPS_COMMON_CHECKPOINT_DIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/checkpoint_file.h"

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
// `dir`: every file its manifest lists, read and checked. Newer steps that
// are incomplete or damaged are passed over, each reason (naming the file
// and what is wrong) appended to `*passed_over`. NOT_FOUND when no step is
// complete.
struct LoadedCheckpoint {
  uint64_t step = 0;
  std::vector<CheckpointId> ids;
  std::vector<std::vector<CheckpointSection>> files;  // by ids
};
absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir,
                                                      uint64_t fingerprint,
                                                      std::vector<std::string>* passed_over);

// Removes all but the newest `keep` complete checkpoints of job
// `fingerprint`, and incomplete steps older than the oldest kept; another
// job's steps and unreadable manifests stay.
absl::Status PruneCheckpoints(const std::string& dir, uint64_t fingerprint, uint32_t keep);

}  // namespace cserps

#endif  // CSERPS_COMMON_CHECKPOINT_DIR_H_
