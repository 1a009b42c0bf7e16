#include "server/sparse_aggregate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

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
  if (n != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("push has ", n, " entries; k is ", k));
  }
  SparseVector entries;
  entries.indices.resize(n);
  entries.values.resize(n);
  if (n > 0) {
    std::memcpy(entries.indices.data(), indices.data(), indices.size());
    std::memcpy(entries.values.data(), values.data(), values.size());
  }
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
  return entries;
}

SparseVector AggregateSparse(absl::Span<const SparseVector> pushes,
                              SparseSelection selection, uint64_t k) {
  // Each push is ascending, so a merge of their heads, by (index, rank),
  // meets an index's contributions in rank order: the double sum does not
  // depend on the order pushes arrived in. O(N log P) for N entries of P
  // members.
  struct Head {
    uint32_t index;
    uint32_t rank;
  };
  auto later = [](const Head& a, const Head& b) {
    return a.index != b.index ? a.index > b.index : a.rank > b.rank;
  };
  std::vector<Head> heads;
  std::vector<size_t> next(pushes.size(), 0);
  size_t total = 0;
  for (uint32_t r = 0; r < pushes.size(); ++r) {
    total += pushes[r].indices.size();
    if (!pushes[r].indices.empty()) heads.push_back({pushes[r].indices[0], r});
  }
  std::make_heap(heads.begin(), heads.end(), later);
  SparseVector sum;
  sum.indices.reserve(total);
  sum.values.reserve(total);
  double acc = 0.0;
  while (!heads.empty()) {
    std::pop_heap(heads.begin(), heads.end(), later);
    Head& head = heads.back();
    const SparseVector& push = pushes[head.rank];
    if (sum.indices.empty() || sum.indices.back() != head.index) {
      if (!sum.indices.empty()) sum.values.push_back(static_cast<float>(acc));
      sum.indices.push_back(head.index);
      acc = 0.0;
    }
    acc += static_cast<double>(push.values[next[head.rank]]);
    if (++next[head.rank] < push.indices.size()) {
      head.index = push.indices[next[head.rank]];
      std::push_heap(heads.begin(), heads.end(), later);
    } else {
      heads.pop_back();
    }
  }
  if (!sum.indices.empty()) sum.values.push_back(static_cast<float>(acc));
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
