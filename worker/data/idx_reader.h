// Reader for IDX files, the format of (Fashion-)MNIST: a big-endian header of
// two zero bytes, a type byte, a dimension count and one uint32 per
// dimension, then the row-major payload. Only unsigned-byte payloads (type
// 0x08) are accepted, which is all MNIST uses. Input may be gzip-compressed.
//
// Nothing in the file is trusted: every size is checked against the bytes
// actually present before it is used. Errors name the file and the byte
// offset of the problem:
//   NOT_FOUND          the file does not exist (ReadIdxFile)
//   DATA_LOSS          corrupt or truncated gzip stream, truncated header or
//                      payload, bytes after the payload
//   INVALID_ARGUMENT   not an IDX file (magic), wrong type byte, dimension
//                      count outside 1..4, a zero dimension, a size overflow
//   RESOURCE_EXHAUSTED gzip input that inflates past kMaxIdxBytes
// Other I/O failures map from errno (PERMISSION_DENIED, ...).
#ifndef CSERPS_WORKER_DATA_IDX_READER_H_
#define CSERPS_WORKER_DATA_IDX_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cserps {

// Upper bound on an IDX file's decompressed size (the largest MNIST file is
// 47 MB); guards against gzip bombs.
inline constexpr size_t kMaxIdxBytes = size_t{1} << 31;

struct IdxArray {
  std::vector<uint32_t> dims;  // from the header, outermost first
  std::vector<uint8_t> data;   // row-major, product(dims) bytes
};

// Parses an IDX file held in `bytes` (plain, or gzip when it starts with
// 0x1f 0x8b). `name` identifies the file in error messages.
absl::StatusOr<IdxArray> ParseIdx(absl::string_view bytes,
                                  absl::string_view name);

// Reads and parses the IDX file at `path`.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

}  // namespace cserps

#endif  // CSERPS_WORKER_DATA_IDX_READER_H_
