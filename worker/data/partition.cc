#include "worker/data/partition.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/status.h"

namespace cserps {
namespace {

// Sizes of every rank's range (largest-remainder method). Products are
// taken in 128 bits so n * b_r cannot overflow.
std::vector<size_t> RangeSizes(size_t n,
                               absl::Span<const uint32_t> batch_sizes) {
  CSERPS_CHECK(!batch_sizes.empty());
  unsigned __int128 total = 0;
  for (uint32_t b : batch_sizes) {
    CSERPS_CHECK(b > 0);
    total += b;
  }
  const size_t ranks = batch_sizes.size();
  std::vector<size_t> sizes(ranks);
  std::vector<uint64_t> remainders(ranks);
  size_t assigned = 0;
  for (size_t r = 0; r < ranks; ++r) {
    const unsigned __int128 share =
        static_cast<unsigned __int128>(n) * batch_sizes[r];
    sizes[r] = static_cast<size_t>(share / total);
    remainders[r] = static_cast<uint64_t>(share % total);
    assigned += sizes[r];
  }
  // Fewer than `ranks` examples are left, since each remainder < 1 example.
  std::vector<size_t> order(ranks);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return remainders[a] > remainders[b];
  });
  for (size_t i = 0; assigned < n; ++i, ++assigned) ++sizes[order[i]];
  return sizes;
}

}  // namespace

Range RankRange(size_t n, absl::Span<const uint32_t> batch_sizes, size_t rank) {
  CSERPS_CHECK(rank < batch_sizes.size());
  const std::vector<size_t> sizes = RangeSizes(n, batch_sizes);
  Range range;
  range.begin = std::accumulate(sizes.begin(), sizes.begin() + rank, size_t{0});
  range.end = range.begin + sizes[rank];
  return range;
}

size_t StepsPerEpoch(size_t n, absl::Span<const uint32_t> batch_sizes) {
  const std::vector<size_t> sizes = RangeSizes(n, batch_sizes);
  size_t steps = sizes[0] / batch_sizes[0];
  for (size_t r = 1; r < sizes.size(); ++r) {
    steps = std::min(steps, sizes[r] / batch_sizes[r]);
  }
  return steps;
}

}  // namespace cserps
