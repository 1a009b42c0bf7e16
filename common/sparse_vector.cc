#include "common/sparse_vector.h"

#include "absl/strings/str_cat.h"

namespace cserps {

absl::Status CheckSparseIndices(absl::Span<const uint32_t> indices, uint64_t first,
                                uint64_t end) {
  const uint64_t n = indices.size();
  if (n == 0) return absl::OkStatus();
  // Ascending, and the first and last inside the shard: then every entry
  // is. Checked without a branch per entry; the loop below names the first
  // bad one otherwise.
  uint32_t out_of_order = 0;
  for (uint64_t i = 1; i < n; ++i) out_of_order |= indices[i] <= indices[i - 1] ? 1 : 0;
  if (out_of_order == 0 && indices[0] >= first && indices[n - 1] < end) return absl::OkStatus();
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t index = indices[i];
    if (index < first || index >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index ", index, " at position ", i, " (byte offset ", 4 * i,
          ") is outside the shard's floats [", first, ", ", end, ")"));
    }
    if (i > 0 && index <= indices[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices must be strictly ascending: index ", index, " at position ", i,
          " (byte offset ", 4 * i, ") ",
          index == indices[i - 1] ? "repeats" : "is below",
          " index ", indices[i - 1], " at position ", i - 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace cserps
