#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace cserps {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f &&
         static_cast<uint8_t>(bytes[1]) == 0x8b;
}

const char* IdxTypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "not an IDX type";
  }
}

// Inflates every gzip member of `in`. zlib's avail_in/avail_out are 32-bit,
// so input and output are fed in slices.
absl::StatusOr<std::string> Gunzip(absl::string_view in,
                                   absl::string_view name) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {  // +16: gzip wrapper only
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": cannot initialise zlib"));
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);

  constexpr size_t kSlice = size_t{1} << 30;
  std::string out(std::min(kMaxIdxBytes, std::max<size_t>(in.size() * 4, 4096)),
                  '\0');
  size_t fed = 0;       // input bytes handed to zlib so far
  size_t produced = 0;  // output bytes written so far
  while (true) {
    if (zs.avail_in == 0 && fed < in.size()) {
      const size_t n = std::min(in.size() - fed, kSlice);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + fed));
      zs.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    if (produced == out.size()) {
      if (out.size() >= kMaxIdxBytes) {
        return absl::ResourceExhaustedError(
            absl::StrFormat("%s: gzip data inflates to more than %d bytes",
                            name, kMaxIdxBytes));
      }
      out.resize(std::min(kMaxIdxBytes, out.size() * 2));
    }
    const size_t room = std::min(out.size() - produced, kSlice);
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(room);
    const int ret = inflate(&zs, Z_NO_FLUSH);
    produced += room - zs.avail_out;
    const size_t consumed = fed - zs.avail_in;
    if (ret == Z_STREAM_END) {
      if (consumed == in.size()) break;
      // gzip allows concatenated members; anything else is garbage.
      if (!IsGzip(in.substr(consumed))) {
        return absl::DataLossError(absl::StrFormat(
            "%s: %d bytes of garbage after the gzip stream at compressed "
            "offset %d",
            name, in.size() - consumed, consumed));
      }
      if (inflateReset(&zs) != Z_OK) {
        return absl::InternalError(
            absl::StrCat(name, ": zlib inflateReset failed"));
      }
      continue;
    }
    if (ret == Z_BUF_ERROR && zs.avail_in == 0 && fed == in.size()) {
      return absl::DataLossError(absl::StrFormat(
          "%s: gzip stream truncated: input ends at compressed offset %d "
          "before the end of the stream",
          name, consumed));
    }
    if (ret == Z_MEM_ERROR) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ": out of memory while inflating"));
    }
    if (ret != Z_OK && ret != Z_BUF_ERROR) {
      return absl::DataLossError(absl::StrFormat(
          "%s: corrupt gzip data near compressed offset %d: %s", name, consumed,
          zs.msg != nullptr ? zs.msg : "unknown zlib error"));
    }
  }
  out.resize(produced);
  return out;
}

uint32_t ReadBigEndian32(absl::string_view bytes, size_t offset) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data() + offset);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

absl::StatusOr<IdxArray> ParsePlainIdx(absl::string_view bytes,
                                       absl::string_view name) {
  if (bytes.size() < 4) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated header: the magic needs 4 bytes, file has %d", name,
        bytes.size()));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (b[0] != 0 || b[1] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX file: bytes at offset 0-1 are 0x%02x 0x%02x, "
        "expected 0x00 0x00",
        name, b[0], b[1]));
  }
  if (b[2] != kTypeUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: type byte at offset 2 is 0x%02x (%s); only 0x08 (unsigned "
        "byte) is supported",
        name, b[2], IdxTypeName(b[2])));
  }
  const size_t ndims = b[3];
  if (ndims < 1 || ndims > 4) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: dimension count at offset 3 is %d, expected 1 to 4", name, ndims));
  }
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated header: %d dimensions need %d header bytes, file has "
        "%d",
        name, ndims, header, bytes.size()));
  }
  IdxArray array;
  array.dims.resize(ndims);
  size_t total = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const size_t offset = 4 + 4 * i;
    const uint32_t dim = ReadBigEndian32(bytes, offset);
    if (dim == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: dimension %d (at offset %d) is zero", name, i, offset));
    }
    if (total > std::numeric_limits<size_t>::max() / dim) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: dimension %d (at offset %d) is %d: the product of the "
          "dimensions overflows",
          name, i, offset, dim));
    }
    total *= dim;
    array.dims[i] = dim;
  }
  const size_t present = bytes.size() - header;
  if (present < total) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated payload: dimensions [%s] need %d bytes from offset "
        "%d, only %d are present",
        name, absl::StrJoin(array.dims, ", "), total, header, present));
  }
  if (present > total) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d trailing bytes at offset %d after the payload of dimensions "
        "[%s]",
        name, present - total, header + total,
        absl::StrJoin(array.dims, ", ")));
  }
  array.data.assign(b + header, b + header + total);
  return array;
}

}  // namespace

absl::StatusOr<IdxArray> ParseIdx(absl::string_view bytes,
                                  absl::string_view name) {
  if (!IsGzip(bytes)) return ParsePlainIdx(bytes, name);
  ASSIGN_OR_RETURN(std::string plain, Gunzip(bytes, name));
  // Offsets in later errors count decompressed bytes; say so.
  return ParsePlainIdx(plain, absl::StrCat(name, " (decompressed)"));
}

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"),
                                             std::fclose);
  if (file == nullptr) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const size_t n = std::fread(buffer, 1, sizeof(buffer), file.get());
    bytes.append(buffer, n);
    if (n < sizeof(buffer)) break;
    if (bytes.size() > kMaxIdxBytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: file is larger than %d bytes", path, kMaxIdxBytes));
    }
  }
  if (std::ferror(file.get())) {
    return absl::ErrnoToStatus(
        errno, absl::StrFormat("%s: read failed at byte offset %d", path,
                               bytes.size()));
  }
  return ParseIdx(bytes, path);
}

}  // namespace cserps
