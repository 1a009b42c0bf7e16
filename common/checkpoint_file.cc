#include "common/checkpoint_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace cserps {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian; add byte swapping first");

// "CSCK"
constexpr uint32_t kMagic = 0x4B435343;
constexpr uint32_t kVersion = 1;
// magic, version, fingerprint, step, role, index, sections, reserved,
// payload bytes, then the CRC32 of those 48 bytes and the payload, and a
// reserved word.
constexpr size_t kHeaderBytes = 56;
constexpr size_t kCrcOffset = 48;
constexpr size_t kMaxNameBytes = 256;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T Get(const char* in) {
  T v;
  std::memcpy(&v, in, sizeof(T));
  return v;
}

// Continues `crc` (0 to start) over `bytes`.
uint32_t Crc32(absl::string_view bytes, uint32_t crc = 0) {
  // zlib takes lengths as uInt: feed it in pieces.
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = static_cast<uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(n)));
    bytes.remove_prefix(n);
  }
  return crc;
}

absl::Status Errno(absl::string_view path, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("checkpoint file ", path, ": ", what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(path, "write");
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

const char* RoleName(uint32_t role) {
  return role == static_cast<uint32_t>(CheckpointRole::kShard)  ? "shard"
         : role == static_cast<uint32_t>(CheckpointRole::kRank) ? "rank"
                                                                 : "unknown role";
}

}  // namespace

absl::Status WriteCheckpointFile(const std::string& path, const CheckpointId& id,
                                 absl::Span<const CheckpointSectionView> sections) {
  std::string payload;
  absl::flat_hash_set<absl::string_view> names;
  for (const CheckpointSectionView& s : sections) {
    if (s.name.empty() || s.name.size() > kMaxNameBytes || !names.insert(s.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file ", path, ": section name '", s.name,
          "' is empty, longer than ", kMaxNameBytes, " bytes, or not unique"));
    }
    Put<uint32_t>(&payload, static_cast<uint32_t>(s.name.size()));
    payload.append(s.name.data(), s.name.size());
    Put<uint64_t>(&payload, s.values.size());
  }
  for (const CheckpointSectionView& s : sections) {
    payload.append(reinterpret_cast<const char*>(s.values.data()), s.values.size() * sizeof(float));
  }
  std::string header;
  Put<uint32_t>(&header, kMagic);
  Put<uint32_t>(&header, kVersion);
  Put<uint64_t>(&header, id.fingerprint);
  Put<uint64_t>(&header, id.step);
  Put<uint32_t>(&header, static_cast<uint32_t>(id.role));
  Put<uint32_t>(&header, id.index);
  Put<uint32_t>(&header, static_cast<uint32_t>(sections.size()));
  Put<uint32_t>(&header, 0);
  Put<uint64_t>(&header, payload.size());
  Put<uint32_t>(&header, Crc32(payload, Crc32(header)));
  Put<uint32_t>(&header, 0);

  return WriteFileAtomically(path, {header, payload});
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts) {
  // Unique to the writer: the threads of one process (local ranks, a
  // test's workers) may write the same file, the same manifest, at once,
  // and so may processes of containers on one volume, each of them pid 1
  // (hence the random part).
  static std::atomic<uint64_t> writes{0};
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), 0) != sizeof(random)) return Errno(path, "getrandom");
  const std::string temporary = absl::StrCat(path, ".tmp.", getpid(), ".", writes.fetch_add(1),
                                             ".", absl::Hex(random, absl::kZeroPad16));
  // Readable by this user only: a checkpoint holds the model.
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(temporary, "open");
  absl::Status ok;
  for (absl::string_view part : parts) {
    if (ok.ok()) ok = WriteAll(fd, part, temporary);
  }
  if (ok.ok() && fsync(fd) != 0) ok = Errno(temporary, "fsync");
  if (close(fd) != 0 && ok.ok()) ok = Errno(temporary, "close");
  if (ok.ok() && rename(temporary.c_str(), path.c_str()) != 0) ok = Errno(path, "rename");
  if (!ok.ok()) {
    unlink(temporary.c_str());
    return ok;
  }
  // The rename is durable once the folder is.
  return SyncFolder(std::filesystem::path(path).parent_path().string());
}

absl::Status SyncFolder(const std::string& folder) {
  const int dir = open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return Errno(folder, "open the folder");
  const bool synced = fsync(dir) == 0;
  close(dir);
  if (!synced) return Errno(folder, "fsync the folder");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointSection>> ReadCheckpointFile(const std::string& path,
                                                                  const CheckpointId& want) {
  auto refuse = [&](absl::StatusCode code, absl::string_view why) {
    return absl::Status(code, absl::StrCat("checkpoint file ", path, ": ", why));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return refuse(absl::StatusCode::kNotFound,
                  absl::StrCat("cannot open: ", std::strerror(errno)));
  }
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status error = Errno(path, "read");
      close(fd);
      return error;
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return ParseCheckpointFile(bytes, path, want);
}

absl::StatusOr<std::vector<CheckpointSection>> ParseCheckpointFile(absl::string_view bytes,
                                                                   absl::string_view path,
                                                                   const CheckpointId& want) {
  auto refuse = [&](absl::StatusCode code, absl::string_view why) {
    return absl::Status(code, absl::StrCat("checkpoint file ", path, ": ", why));
  };
  if (bytes.size() < kHeaderBytes || Get<uint32_t>(bytes.data()) != kMagic) {
    return refuse(absl::StatusCode::kDataLoss, "not a cserps checkpoint file (no CSCK header)");
  }
  const char* h = bytes.data();
  if (const uint32_t version = Get<uint32_t>(h + 4); version != kVersion) {
    return refuse(absl::StatusCode::kDataLoss,
                  absl::StrCat("format version ", version, ", this build reads ", kVersion));
  }
  const uint64_t fingerprint = Get<uint64_t>(h + 8), step = Get<uint64_t>(h + 16);
  const uint32_t role = Get<uint32_t>(h + 24), index = Get<uint32_t>(h + 28);
  const uint32_t num_sections = Get<uint32_t>(h + 32);
  const uint64_t payload_bytes = Get<uint64_t>(h + 40);
  const uint32_t crc = Get<uint32_t>(h + kCrcOffset);
  if (bytes.size() - kHeaderBytes != payload_bytes) {
    return refuse(absl::StatusCode::kDataLoss,
                  absl::StrCat(bytes.size() - kHeaderBytes < payload_bytes ? "truncated" : "too long",
                               ": the header says ", payload_bytes,
                               " bytes follow it, the file has ", bytes.size() - kHeaderBytes));
  }
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  if (const uint32_t actual = Crc32(payload, Crc32(bytes.substr(0, kCrcOffset)));
      actual != crc) {
    return refuse(absl::StatusCode::kDataLoss,
                  absl::StrCat("CRC32 0x", absl::Hex(actual, absl::kZeroPad8),
                               " of the contents differs from the header's 0x",
                               absl::Hex(crc, absl::kZeroPad8), ": the file is corrupt"));
  }
  if (fingerprint != want.fingerprint) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("written by a job with fingerprint 0x",
                               absl::Hex(fingerprint, absl::kZeroPad16), ", this job's is 0x",
                               absl::Hex(want.fingerprint, absl::kZeroPad16)));
  }
  if (step != want.step || role != static_cast<uint32_t>(want.role) || index != want.index) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("holds step ", step, " of ", RoleName(role), " ", index,
                               "; expected step ", want.step, " of ",
                               RoleName(static_cast<uint32_t>(want.role)), " ", want.index));
  }
  // Each section takes at least 13 bytes of the table: a count the payload
  // cannot hold is refused before anything is allocated for it.
  if (num_sections > payload.size() / 13) {
    return refuse(absl::StatusCode::kDataLoss,
                  absl::StrCat("malformed section table: ", num_sections, " sections in ",
                               payload.size(), " bytes"));
  }
  std::vector<CheckpointSection> sections(num_sections);
  size_t at = 0;
  auto need = [&](size_t n) { return payload.size() - at >= n; };
  uint64_t floats = 0;
  for (CheckpointSection& s : sections) {
    if (!need(4)) return refuse(absl::StatusCode::kDataLoss, "malformed section table");
    const uint32_t name_bytes = Get<uint32_t>(payload.data() + at);
    at += 4;
    if (name_bytes == 0 || name_bytes > kMaxNameBytes || !need(name_bytes + 8)) {
      return refuse(absl::StatusCode::kDataLoss, "malformed section table");
    }
    s.name = std::string(payload.substr(at, name_bytes));
    at += name_bytes;
    const uint64_t count = Get<uint64_t>(payload.data() + at);
    at += 8;
    // The sections so far must fit in the bytes after the table read so
    // far: nothing is allocated beyond the file's own size.
    const uint64_t room = (payload.size() - at) / sizeof(float);
    if (count > room || floats + count > room) {
      return refuse(absl::StatusCode::kDataLoss,
                    absl::StrCat("malformed section table: section '", s.name, "' claims ",
                                 count, " floats after ", floats, "; ", payload.size() - at,
                                 " bytes follow"));
    }
    s.values.resize(count);
    floats += count;
  }
  if (payload.size() - at != floats * sizeof(float)) {
    return refuse(absl::StatusCode::kDataLoss,
                  absl::StrCat("the sections hold ", floats, " floats; ",
                               payload.size() - at, " bytes follow the table"));
  }
  for (CheckpointSection& s : sections) {
    if (s.values.empty()) continue;  // its data() may be null, which memcpy must not get
    std::memcpy(s.values.data(), payload.data() + at, s.values.size() * sizeof(float));
    at += s.values.size() * sizeof(float);
  }
  return sections;
}

}  // namespace cserps
