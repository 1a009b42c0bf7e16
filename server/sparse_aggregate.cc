#include "server/sparse_aggregate.h"

#include <algorithm>
#include <array>
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

// |v| for ranking, as its bits: without the sign bit they order as the
// magnitudes do, and a NaN counts as infinite so that the order stays
// strict.
uint32_t MagnitudeBits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return std::min(bits & 0x7fffffffu, 0x7f800000u);
}

// The k-th largest of `values` (1 <= k <= values.size()): a radix select
// over digits of 11, 11 and 10 bits from the top, each pass over the
// values that share the digits chosen so far. O(U), and no worse on ties
// (std::nth_element fell back to a heap select on many equal magnitudes).
uint32_t KthLargest(std::vector<uint32_t> values, uint64_t k) {
  uint32_t chosen = 0;
  for (const int shift : {21, 10, 0}) {
    const uint32_t mask = shift == 0 ? 0x3ffu : 0x7ffu;
    std::array<uint32_t, 2048> count{};
    for (uint32_t v : values) ++count[(v >> shift) & mask];
    uint32_t digit = mask;
    while (count[digit] < k) k -= count[digit--];
    chosen |= digit << shift;
    size_t n = 0;
    for (uint32_t v : values) {
      values[n] = v;
      n += ((v >> shift) & mask) == digit ? 1 : 0;
    }
    values.resize(n);
  }
  return chosen;
}

// The sums of two members' ascending pushes, as the heap's merge makes
// them ((0.0 + a) + b, 0.0 + a, or 0.0 + b: adding 0.0 to 0.0 + a changes
// no bits), without a branch per entry: two members' random indices would
// mispredict one in two. Returns how many distinct indices.
size_t MergeTwo(const SparseVector& a, const SparseVector& b, SparseVector* sum) {
  const size_t na = a.indices.size(), nb = b.indices.size();
  size_t i = 0, j = 0, u = 0;
  while (i < na && j < nb) {
    const uint32_t ia = a.indices[i], ib = b.indices[j];
    const bool take_a = ia <= ib, take_b = ib <= ia;
    const double va = take_a ? static_cast<double>(a.values[i]) : 0.0;
    const double vb = take_b ? static_cast<double>(b.values[j]) : 0.0;
    sum->indices[u] = take_a ? ia : ib;
    sum->values[u] = static_cast<float>((0.0 + va) + vb);
    ++u;
    i += take_a ? 1 : 0;
    j += take_b ? 1 : 0;
  }
  for (const auto& [push, from] : {std::pair{&a, i}, std::pair{&b, j}}) {
    for (size_t n = from; n < push->indices.size(); ++n, ++u) {
      sum->indices[u] = push->indices[n];
      sum->values[u] = static_cast<float>(0.0 + static_cast<double>(push->values[n]));
    }
  }
  return u;
}

// The sums of the members' ascending pushes into `out` (sized for every
// entry); returns how many distinct indices.
size_t MergeHeads(absl::Span<const SparseVector> pushes, SparseVector* out) {
  // Each push is ascending, so a merge of their heads by key (the index in
  // the high 32 bits, the rank in the low) meets an index's contributions
  // in rank order: the double sum does not depend on the order pushes
  // arrived in. A min-heap of the heads: O(N log P) for N entries of P
  // members.
  std::vector<uint64_t> heap;
  std::vector<size_t> next(pushes.size(), 0);
  for (uint32_t r = 0; r < pushes.size(); ++r) {
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
  SparseVector& sum = *out;
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
  return u;
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
  return CheckSparseIndices(entries.indices, first, end);
}

SparseVector AggregateSparse(absl::Span<const SparseVector> pushes,
                              SparseSelection selection, uint64_t k) {
  size_t total = 0;
  for (const SparseVector& push : pushes) total += push.indices.size();
  SparseVector sum;
  sum.indices.resize(total);
  sum.values.resize(total);
  const size_t u = pushes.size() == 2 ? MergeTwo(pushes[0], pushes[1], &sum)
                                      : MergeHeads(pushes, &sum);
  sum.indices.resize(u);
  sum.values.resize(u);
  if (selection == SparseSelection::kUnion || sum.indices.size() <= k) return sum;

  // The k entries first by (magnitude descending, index ascending): every
  // one above the k-th largest magnitude t, then those equal to t from the
  // lowest index on. O(U), kept without a branch per entry.
  std::vector<uint32_t> magnitudes(sum.values.size());
  for (size_t i = 0; i < magnitudes.size(); ++i) magnitudes[i] = MagnitudeBits(sum.values[i]);
  const uint32_t t = KthLargest(magnitudes, k);
  uint64_t at_t = k;  // the entries equal to t that are kept
  for (uint32_t m : magnitudes) at_t -= m > t ? 1 : 0;
  SparseVector kept;
  // One spare place: an entry not kept is written past the last kept one.
  kept.indices.resize(k + 1);
  kept.values.resize(k + 1);
  size_t n = 0;
  for (size_t i = 0; i < magnitudes.size(); ++i) {
    const bool equal_kept = magnitudes[i] == t && at_t > 0;
    at_t -= equal_kept ? 1 : 0;
    kept.indices[n] = sum.indices[i];
    kept.values[n] = sum.values[i];
    n += magnitudes[i] > t || equal_kept ? 1 : 0;
  }
  kept.indices.resize(k);
  kept.values.resize(k);
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
