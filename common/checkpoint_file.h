// One file of a checkpoint (docs/reliability.md): a fixed header naming the
// job, step and writer, a table of named float sections and their floats,
// and a CRC32 (zlib) over the header's fields and all that follows. Written atomically:
// a temporary file, fsync, rename over the final name, fsync of the folder;
// a reader sees the old file or the new one, never a part.
#ifndef CSERPS_COMMON_CHECKPOINT_FILE_H_
#define CSERPS_COMMON_CHECKPOINT_FILE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace cserps {

// Who wrote a file: a server shard or a worker rank.
enum class CheckpointRole : uint32_t { kShard = 1, kRank = 2 };

struct CheckpointId {
  uint64_t fingerprint = 0;  // the job's (common/config_fingerprint.h)
  uint64_t step = 0;         // steps done when it was taken
  CheckpointRole role = CheckpointRole::kShard;
  uint32_t index = 0;        // the shard or the rank
};

struct CheckpointSectionView {
  absl::string_view name;
  absl::Span<const float> values;
};

struct CheckpointSection {
  std::string name;
  std::vector<float> values;
};

// Writes `sections` (names unique, non-empty, at most 256 bytes) under `id`
// to `path` atomically. The folder must exist.
absl::Status WriteCheckpointFile(const std::string& path, const CheckpointId& id,
                                 absl::Span<const CheckpointSectionView> sections);

// Writes the concatenation of `parts` to `path` as above: temporary file,
// fsync, rename, fsync of the folder.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts);

// Makes the entries of `folder` (files written, renamed or removed in it)
// durable.
absl::Status SyncFolder(const std::string& folder);

// Reads `path`, which must be `want`'s file. Every refusal names the file:
//   NOT_FOUND            it cannot be opened;
//   DATA_LOSS            not a checkpoint file, an unknown format version,
//                        truncated or longer than its header says, a CRC32
//                        that does not match, a malformed section table;
//   FAILED_PRECONDITION  another job's fingerprint, another step, or
//                        another shard or rank.
absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpointFile(const std::string& path,
                                                                  const CheckpointId& want);

// ReadCheckpointFile's checks on the file's `bytes`, `path` naming it.
absl::StatusOr<std::vector<CheckpointSection>> ParseCheckpointFile(absl::string_view bytes,
                                                                   absl::string_view path,
                                                                   const CheckpointId& want);

}  // namespace cserps

#endif  // CSERPS_COMMON_CHECKPOINT_FILE_H_
