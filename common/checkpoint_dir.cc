#include "common/checkpoint_dir.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include <zlib.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/config_fingerprint.h"
#include "common/status.h"

namespace cserps {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "MANIFEST";
constexpr char kManifestFirstLine[] = "cserps checkpoint manifest 2";
// Its last line: the CRC32 (zlib's) of every byte before it. A manifest cut
// short or with a flipped bit would otherwise list fewer or other files and
// still read as complete.
constexpr char kManifestCrcWord[] = "crc32";
constexpr char kStepPrefix[] = "step-";
constexpr size_t kStepDigits = 20;

uint32_t Crc32(absl::string_view bytes) {
  return static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data()),
                                     static_cast<uInt>(bytes.size())));
}

// The step of a folder named as CheckpointStepDir names it; none for any
// other name ("step-300" beside step-00000000000000000300 would be the same
// step twice).
std::optional<uint64_t> StepOfFolder(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kStepPrefix) || name.size() != kStepDigits) return std::nullopt;
  uint64_t step = 0;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  return step;
}

// The steps with a folder in `dir`, newest first; none when `dir` does not
// exist. A folder that cannot be listed is an error: taken for an empty
// one, it would start a job afresh over its checkpoints.
absl::StatusOr<std::vector<uint64_t>> StepsNewestFirst(const std::string& dir) {
  std::vector<uint64_t> steps;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error == std::errc::no_such_file_or_directory) return steps;
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const std::optional<uint64_t> step = StepOfFolder(it->path().filename().string());
    std::error_code kind_error;
    if (step.has_value() && it->is_directory(kind_error)) steps.push_back(*step);
  }
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint folder ", dir, " cannot be listed: ", error.message()));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

struct Manifest {
  uint64_t fingerprint = 0;
  uint64_t step = 0;
  std::vector<CheckpointId> files;
};

// The manifest of `step`, or why there is none that can be used.
absl::StatusOr<Manifest> ReadManifest(const std::string& dir, uint64_t step) {
  const std::string path = (fs::path(CheckpointStepDir(dir, step)) / kManifest).string();
  std::ifstream in(path);
  if (!in) {
    const int failed = errno;
    if (failed != ENOENT) {
      return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                              " cannot be read: ", std::strerror(failed)));
    }
    return absl::NotFoundError(absl::StrCat("checkpoint of step ", step, ": no ", path,
                                            " (not complete)"));
  }
  auto malformed = [&](absl::string_view line) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, ": malformed line '",
                                            line, "'"));
  };
  std::string text;
  try {
    // libstdc++'s filebuf throws on a failed read (EIO, EISDIR), whatever
    // the stream's exception mask.
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    in.setstate(std::ios_base::badbit);
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            " cannot be read: ", std::strerror(errno)));
  }
  const absl::string_view all(text);
  if (absl::StartsWith(all, "cserps checkpoint manifest 1\n")) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint manifest ", path, ": format 1, of an earlier cserps, which had no CRC32; "
        "this one reads format 2 (start the job afresh in another checkpoint.dir)"));
  }
  // "...\ncrc32 xxxxxxxx\n"
  const size_t last = all.size() < 2 ? std::string::npos : all.rfind('\n', all.size() - 2);
  absl::string_view crc_line = last == std::string::npos ? "" : all.substr(last + 1);
  uint32_t crc = 0;
  if (!absl::ConsumeSuffix(&crc_line, "\n") ||
      !absl::ConsumePrefix(&crc_line, absl::StrCat(kManifestCrcWord, " ")) ||
      crc_line.size() != 8 || !absl::SimpleHexAtoi(crc_line, &crc)) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            ": does not end with its CRC32 line (cut short?)"));
  }
  const absl::string_view body = all.substr(0, last + 1);
  if (crc != Crc32(body)) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            ": CRC32 does not match its contents"));
  }
  Manifest m;
  std::vector<absl::string_view> lines = absl::StrSplit(body.substr(0, body.size() - 1), '\n');
  if (lines[0] != kManifestFirstLine) return malformed(lines[0]);
  bool have_fingerprint = false, have_step = false;
  absl::flat_hash_set<std::pair<CheckpointRole, uint32_t>> listed;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
    if (words.size() != 2) return malformed(line);
    if (words[0] == "fingerprint" && absl::SimpleHexAtoi(words[1], &m.fingerprint)) {
      have_fingerprint = true;
    } else if (words[0] == "step" && absl::SimpleAtoi(words[1], &m.step)) {
      have_step = true;
    } else if ((words[0] == "shard" || words[0] == "rank") && have_fingerprint && have_step) {
      CheckpointId id{m.fingerprint, m.step,
                      words[0] == "shard" ? CheckpointRole::kShard : CheckpointRole::kRank, 0};
      if (!absl::SimpleAtoi(words[1], &id.index) || !listed.emplace(id.role, id.index).second) {
        return malformed(line);
      }
      m.files.push_back(id);
    } else {
      return malformed(line);
    }
  }
  if (!have_fingerprint || !have_step || m.step != step || m.files.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path,
                                            ": lacks its fingerprint, step or files, or names "
                                            "another step"));
  }
  return m;
}

}  // namespace

std::string CheckpointStepDir(const std::string& dir, uint64_t step) {
  return (fs::path(dir) / absl::StrFormat("%s%020d", kStepPrefix, step)).string();
}

std::string CheckpointFileName(CheckpointRole role, uint32_t index) {
  return absl::StrCat(role == CheckpointRole::kShard ? "shard-" : "rank-", index, ".ckpt");
}

absl::Status MakeCheckpointStepDir(const std::string& dir, uint64_t step) {
  std::error_code error;
  // The folders this creates above the step's: each is durable once its
  // entry in its parent is.
  std::vector<fs::path> created;
  for (fs::path up = fs::absolute(dir, error); !error && !up.empty() && !fs::exists(up, error);
       up = up.parent_path()) {
    created.push_back(up);
    if (up == up.parent_path()) break;
  }
  const fs::path step_dir = CheckpointStepDir(dir, step);
  const bool step_created = fs::create_directories(step_dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint folder ", step_dir.string(), ": ", error.message()));
  }
  // Private to the user, as the files are (a checkpoint holds the model):
  // every folder this process created.
  std::vector<fs::path> made = created;
  if (step_created) made.push_back(step_dir);
  for (const fs::path& folder : made) {
    fs::permissions(folder, fs::perms::owner_all, fs::perm_options::replace, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("checkpoint folder ", folder.string(), ": chmod 700: ", error.message()));
    }
  }
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    RETURN_IF_ERROR(SyncFolder(it->parent_path().string()));
  }
  // The step's folder is durable once its entry in `dir` is: the files'
  // own syncs reach only the step's folder.
  return SyncFolder(dir);
}

absl::Status WriteCheckpointManifest(const std::string& dir, uint64_t fingerprint,
                                     uint64_t step, absl::Span<const CheckpointId> files) {
  std::string text = absl::StrCat(kManifestFirstLine, "\nfingerprint ",
                                  absl::Hex(fingerprint, absl::kZeroPad16), "\nstep ", step, "\n");
  for (const CheckpointId& id : files) {
    absl::StrAppend(&text, id.role == CheckpointRole::kShard ? "shard " : "rank ", id.index, "\n");
  }
  absl::StrAppend(&text, kManifestCrcWord, " ", absl::Hex(Crc32(text), absl::kZeroPad8), "\n");
  return WriteFileAtomically((fs::path(CheckpointStepDir(dir, step)) / kManifest).string(),
                             {text});
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(
    const std::string& dir, uint64_t fingerprint, std::vector<std::string>* passed_over,
    const std::function<bool(const CheckpointId&)>& wanted) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> steps, StepsNewestFirst(dir));
  for (uint64_t step : steps) {
    absl::StatusOr<Manifest> manifest = ReadManifest(dir, step);
    if (!manifest.ok()) {
      passed_over->push_back(std::string(manifest.status().message()));
      continue;
    }
    if (manifest->fingerprint != fingerprint) {
      passed_over->push_back(absl::StrCat(
          "checkpoint of step ", step, " in ", dir, ": written by the job with fingerprint 0x",
          absl::Hex(manifest->fingerprint, absl::kZeroPad16), ", this job's is 0x",
          absl::Hex(fingerprint, absl::kZeroPad16)));
      continue;
    }
    LoadedCheckpoint loaded;
    loaded.step = step;
    absl::Status damaged;
    for (const CheckpointId& id : manifest->files) {
      const std::string path =
          (fs::path(CheckpointStepDir(dir, step)) / CheckpointFileName(id.role, id.index)).string();
      absl::StatusOr<std::vector<CheckpointSection>> file = ReadCheckpointFile(path, id);
      if (!file.ok()) {
        damaged = file.status();
        break;
      }
      if (wanted != nullptr && !wanted(id)) continue;
      loaded.ids.push_back(id);
      loaded.files.push_back(*std::move(file));
    }
    if (!damaged.ok()) {
      passed_over->push_back(std::string(damaged.message()));
      continue;
    }
    return loaded;
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint of job 0x",
                                          absl::Hex(fingerprint, absl::kZeroPad16), " in ", dir));
}

absl::StatusOr<bool> HasManifestOf(const std::string& dir, uint64_t fingerprint) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> steps, StepsNewestFirst(dir));
  for (uint64_t step : steps) {
    const absl::StatusOr<Manifest> manifest = ReadManifest(dir, step);
    // One that cannot be read may be this job's.
    if (manifest.ok() ? manifest->fingerprint == fingerprint
                      : !absl::IsNotFound(manifest.status())) {
      return true;
    }
  }
  return false;
}

absl::Status PruneCheckpoints(const std::string& dir, uint64_t fingerprint, uint32_t keep) {
  uint32_t kept = 0;
  ASSIGN_OR_RETURN(const std::vector<uint64_t> steps, StepsNewestFirst(dir));
  for (uint64_t step : steps) {
    absl::StatusOr<Manifest> manifest = ReadManifest(dir, step);
    const bool complete = manifest.ok() && manifest->fingerprint == fingerprint;
    // Another job's steps, and manifests that cannot be read, are not ours
    // to remove.
    if (manifest.ok() ? !complete : !absl::IsNotFound(manifest.status())) continue;
    // Incomplete steps newer than the newest kept may still be being written.
    if (kept < keep) {
      if (complete) ++kept;
      continue;
    }
    std::error_code error;
    fs::remove_all(CheckpointStepDir(dir, step), error);
    // Two processes that complete a step together both prune.
    if (error && error != std::errc::no_such_file_or_directory) {
      return absl::UnavailableError(absl::StrCat("removing ", CheckpointStepDir(dir, step), ": ",
                                                 error.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ForgetPartsAfter(const CheckpointJob& job, CheckpointRole role, uint32_t index,
                              uint64_t step) {
  if (job.dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<uint64_t> steps, StepsNewestFirst(job.dir));
  for (uint64_t later : steps) {
    if (later <= step) break;
    const std::string folder = CheckpointStepDir(job.dir, later);
    const std::string path = (fs::path(folder) / CheckpointFileName(role, index)).string();
    // Another job's file (the folder may be shared), or one that is not
    // whole, is not this process's to remove.
    if (!ReadCheckpointFile(path, CheckpointId{job.fingerprint, later, role, index}).ok()) {
      continue;
    }
    std::error_code error;
    fs::remove(path, error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("removing ", path, ": ", error.message()));
    }
    RETURN_IF_ERROR(SyncFolder(folder));
  }
  return absl::OkStatus();
}

namespace {

// Removes the incomplete steps older than `step`, newer than every complete
// step, but the newest of them. Every live process wrote its part of a
// checkpoint before any took the next one's average, so those steps miss a
// part that will never come (a rank dropped from an elastic job writes
// none), and without this the folder grew by a step at every checkpoint.
// Steps from `step` on are left: after a roll back they may be an abandoned
// timeline's, whose folders the new one writes into again.
absl::Status PruneUnfinished(const std::string& dir, uint64_t fingerprint, uint64_t step) {
  ASSIGN_OR_RETURN(const std::vector<uint64_t> steps, StepsNewestFirst(dir));
  bool newest_spared = false;
  for (uint64_t older : steps) {
    if (older >= step) continue;
    absl::StatusOr<Manifest> manifest = ReadManifest(dir, older);
    if (manifest.ok() && manifest->fingerprint == fingerprint) break;  // complete
    // Another job's steps, and manifests that cannot be read, stay.
    if (manifest.ok() || !absl::IsNotFound(manifest.status())) continue;
    if (!newest_spared) {
      newest_spared = true;
      continue;
    }
    std::error_code error;
    fs::remove_all(CheckpointStepDir(dir, older), error);
    if (error && error != std::errc::no_such_file_or_directory) {
      return absl::UnavailableError(absl::StrCat("removing ", CheckpointStepDir(dir, older),
                                                 ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointJob CheckpointJob::Of(const v1::JobConfig& config) {
  CheckpointJob job;
  job.dir = config.checkpoint().dir();
  job.fingerprint = JobFingerprint(config);
  job.num_shards = static_cast<uint32_t>(config.cluster().servers_size());
  job.num_ranks = config.cluster().num_workers() * std::max(1u, config.cluster().local_size());
  job.keep = std::max(1u, config.checkpoint().keep());
  return job;
}

absl::StatusOr<bool> WriteCheckpointPart(const CheckpointJob& job, CheckpointRole role,
                                         uint32_t index, uint64_t step,
                                         absl::Span<const CheckpointSectionView> sections) {
  if (absl::Status made = MakeCheckpointStepDir(job.dir, step); !made.ok()) return made;
  const fs::path folder = CheckpointStepDir(job.dir, step);
  const absl::Status written = WriteCheckpointFile(
      (folder / CheckpointFileName(role, index)).string(),
      CheckpointId{job.fingerprint, step, role, index}, sections);
  if (!written.ok()) return written;
  // Renamed into place only once whole, so a file that is there is complete.
  std::vector<CheckpointId> files;
  for (const auto& [r, count] : {std::pair{CheckpointRole::kShard, job.num_shards},
                                std::pair{CheckpointRole::kRank, job.num_ranks}}) {
    for (uint32_t i = 0; i < count; ++i) {
      std::error_code error;
      if (!fs::exists(folder / CheckpointFileName(r, i), error)) {
        RETURN_IF_ERROR(PruneUnfinished(job.dir, job.fingerprint, step));
        return false;
      }
      files.push_back(CheckpointId{job.fingerprint, step, r, i});
    }
  }
  if (absl::Status marked = WriteCheckpointManifest(job.dir, job.fingerprint, step, files);
      !marked.ok()) {
    return marked;
  }
  if (absl::Status pruned = PruneCheckpoints(job.dir, job.fingerprint, job.keep); !pruned.ok()) {
    return pruned;
  }
  return true;
}

}  // namespace cserps
