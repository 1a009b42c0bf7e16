// The wire form of float vectors: little-endian IEEE-754 float32, packed, in
// a protobuf `bytes` field. No per-float encoding.
#ifndef CSERPS_COMMON_FLOAT_BYTES_H_
#define CSERPS_COMMON_FLOAT_BYTES_H_

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace cserps {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian float32; add byte swapping "
              "before building on a big-endian host");

inline void AppendFloats(absl::Span<const float> values, std::string* out) {
  out->append(reinterpret_cast<const char*>(values.data()),
              values.size() * sizeof(float));
}

inline std::string FloatsToBytes(absl::Span<const float> values) {
  std::string out;
  AppendFloats(values, &out);
  return out;
}

// Copies `bytes` into `out`; the byte length must be exactly 4 * out.size().
// `what` names the field in the error.
inline absl::Status BytesToFloats(absl::string_view bytes, absl::Span<float> out,
                                  absl::string_view what) {
  if (bytes.size() != out.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", out.size(), " float32 values (",
        out.size() * sizeof(float), " bytes), got ", bytes.size(), " bytes"));
  }
  if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

// Number of floats in `bytes`, or an error when it is not a multiple of 4.
inline absl::Status CheckFloatBytes(absl::string_view bytes,
                                    absl::string_view what) {
  if (bytes.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", bytes.size(),
                     " bytes is not a whole number of float32 values"));
  }
  return absl::OkStatus();
}

}  // namespace cserps

#endif  // CSERPS_COMMON_FLOAT_BYTES_H_
