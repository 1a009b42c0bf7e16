#include "server/sparse_aggregate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
  // (index, rank, position): sorting groups an index's contributions in rank
  // order, so the double sum does not depend on the order pushes arrived in.
  struct Item {
    uint32_t index;
    uint32_t rank;
    float value;
  };
  std::vector<Item> items;
  size_t total = 0;
  for (const SparseVector& p : pushes) total += p.indices.size();
  items.reserve(total);
  for (uint32_t r = 0; r < pushes.size(); ++r) {
    for (size_t i = 0; i < pushes[r].indices.size(); ++i) {
      items.push_back({pushes[r].indices[i], r, pushes[r].values[i]});
    }
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.index != b.index ? a.index < b.index : a.rank < b.rank;
  });
  SparseVector sum;
  for (size_t i = 0; i < items.size();) {
    double acc = 0.0;
    size_t j = i;
    for (; j < items.size() && items[j].index == items[i].index; ++j) {
      acc += static_cast<double>(items[j].value);
    }
    sum.indices.push_back(items[i].index);
    sum.values.push_back(static_cast<float>(acc));
    i = j;
  }
  if (selection == SparseSelection::kUnion || sum.indices.size() <= k) return sum;

  std::vector<uint32_t> order(sum.indices.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  // Positions are ascending by index, so the lower position is the lower index.
  auto larger = [&](uint32_t a, uint32_t b) {
    const float ma = Magnitude(sum.values[a]), mb = Magnitude(sum.values[b]);
    return ma != mb ? ma > mb : a < b;
  };
  std::nth_element(order.begin(), order.begin() + k, order.end(), larger);
  order.resize(k);
  std::sort(order.begin(), order.end());
  SparseVector kept;
  kept.indices.reserve(k);
  kept.values.reserve(k);
  for (uint32_t i : order) {
    kept.indices.push_back(sum.indices[i]);
    kept.values.push_back(sum.values[i]);
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
