#include "server/sparse_aggregate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the sparse wire format is little-endian; add byte swapping "
              "before building on a big-endian host");

// |v| for ranking; a NaN counts as infinite so that the order stays strict.
float Magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

}  // namespace

absl::StatusOr<SparseVector> ParseSparsePush(absl::string_view indices,
                                              absl::string_view values,
                                              uint64_t k, uint64_t first,
                                              uint64_t end) {
  if (indices.size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indices: ", indices.size(), " bytes is not a whole number of uint32 values"));
  }
  if (values.size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values: ", values.size(), " bytes is not a whole number of float32 values"));
  }
  const uint64_t n = indices.size() / 4;
  if (values.size() / 4 != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indices has ", n, " entries but values has ", values.size() / 4));
  }
  SparseVector entries;
  entries.indices.resize(n);
  entries.values.resize(n);
  if (n > 0) {
    std::memcpy(entries.indices.data(), indices.data(), indices.size());
    std::memcpy(entries.values.data(), values.data(), values.size());
  }
  RETURN_IF_ERROR(CheckSparseEntries(entries, k, first, end));
  return entries;
}

absl::Status CheckSparseEntries(const SparseVector& entries, uint64_t k, uint64_t first,
                                uint64_t end) {
  const uint64_t n = entries.indices.size();
  if (n != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("push has ", n, " entries; k is ", k));
  }
  if (n == 0) return absl::OkStatus();
  // Ascending, and the first and last inside the shard: then every entry
  // is. Checked without a branch per entry; the loop below names the first
  // bad one otherwise.
  const uint32_t* indices = entries.indices.data();
  uint32_t out_of_order = 0;
  for (uint64_t i = 1; i < n; ++i) out_of_order |= indices[i] <= indices[i - 1] ? 1 : 0;
  if (out_of_order == 0 && indices[0] >= first && indices[n - 1] < end) return absl::OkStatus();
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t index = entries.indices[i];
    if (index < first || index >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index ", index, " at position ", i, " (byte offset ", 4 * i,
          ") is outside this shard's floats [", first, ", ", end, ")"));
    }
    if (i > 0 && index <= entries.indices[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices must be strictly ascending: index ", index, " at position ", i,
          " (byte offset ", 4 * i, ") ",
          index == entries.indices[i - 1] ? "repeats" : "is below",
          " index ", entries.indices[i - 1], " at position ", i - 1));
    }
  }
  return absl::OkStatus();
}

SparseVector AggregateSparse(absl::Span<const SparseVector> pushes,
                              SparseSelection selection, uint64_t k) {
  // Each push is ascending, so a merge of their heads by key (the index in
  // the high 32 bits, the rank in the low) meets an index's contributions
  // in rank order: the double sum does not depend on the order pushes
  // arrived in. A min-heap of the heads: O(N log P) for N entries of P
  // members.
  std::vector<uint64_t> heap;
  std::vector<size_t> next(pushes.size(), 0);
  size_t total = 0;
  for (uint32_t r = 0; r < pushes.size(); ++r) {
    total += pushes[r].indices.size();
    if (!pushes[r].indices.empty()) heap.push_back(uint64_t{pushes[r].indices[0]} << 32 | r);
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  // The top replaced, then moved down to its place.
  auto sift_down = [&heap] {
    const size_t n = heap.size();
    const uint64_t moving = heap[0];
    size_t at = 0;
    for (size_t child = 1; child < n; child = 2 * at + 1) {
      if (child + 1 < n && heap[child + 1] < heap[child]) ++child;
      if (moving <= heap[child]) break;
      heap[at] = heap[child];
      at = child;
    }
    heap[at] = moving;
  };
  SparseVector sum;
  sum.indices.resize(total);
  sum.values.resize(total);
  size_t u = 0;  // distinct indices so far
  double acc = 0.0;
  while (!heap.empty()) {
    const uint32_t r = static_cast<uint32_t>(heap[0]);
    const SparseVector& push = pushes[r];
    // The smallest head of the others: the top's entries below it come
    // first, without the heap.
    uint64_t bound = std::numeric_limits<uint64_t>::max();
    if (heap.size() > 1) bound = heap[1];
    if (heap.size() > 2) bound = std::min(bound, heap[2]);
    const size_t n = push.indices.size();
    size_t i = next[r];
    do {
      const uint32_t index = push.indices[i];
      if (u == 0 || sum.indices[u - 1] != index) {
        if (u > 0) sum.values[u - 1] = static_cast<float>(acc);
        sum.indices[u++] = index;
        acc = 0.0;
      }
      acc += static_cast<double>(push.values[i]);
      ++i;
    } while (i < n && (uint64_t{push.indices[i]} << 32 | r) < bound);
    next[r] = i;
    if (i < n) {
      heap[0] = uint64_t{push.indices[i]} << 32 | r;
    } else {
      heap[0] = heap.back();
      heap.pop_back();
    }
    if (!heap.empty()) sift_down();
  }
  if (u > 0) sum.values[u - 1] = static_cast<float>(acc);
  sum.indices.resize(u);
  sum.values.resize(u);
  if (selection == SparseSelection::kUnion || sum.indices.size() <= k) return sum;

  // The k entries first by (magnitude descending, index ascending): every
  // one above the k-th largest magnitude t, then those equal to t from the
  // lowest index on. O(U).
  std::vector<float> magnitudes(sum.values.size());
  for (size_t i = 0; i < magnitudes.size(); ++i) magnitudes[i] = Magnitude(sum.values[i]);
  std::vector<float> ranked = magnitudes;
  std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), std::greater<>());
  const float t = ranked[k - 1];
  uint64_t at_t = k;  // the entries equal to t that are kept
  for (float m : magnitudes) at_t -= m > t ? 1 : 0;
  SparseVector kept;
  kept.indices.reserve(k);
  kept.values.reserve(k);
  for (size_t i = 0; i < magnitudes.size(); ++i) {
    if (magnitudes[i] > t || (magnitudes[i] == t && at_t > 0)) {
      if (magnitudes[i] == t) --at_t;
      kept.indices.push_back(sum.indices[i]);
      kept.values.push_back(sum.values[i]);
    }
  }
  return kept;
}

SparseReply EncodeSparse(const SparseVector& entries) {
  SparseReply reply;
  reply.indices.assign(reinterpret_cast<const char*>(entries.indices.data()),
                       entries.indices.size() * sizeof(uint32_t));
  reply.values.assign(reinterpret_cast<const char*>(entries.values.data()),
                      entries.values.size() * sizeof(float));
  return reply;
}

}  // namespace cserps
