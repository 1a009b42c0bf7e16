// Splits a training set of n examples among the ranks of a job: rank r gets
// one contiguous range, ranks in order, sized in proportion to its batch
// size, so every rank runs about the same number of steps per epoch.
// Every process computes the same split from the same inputs.
#ifndef CSERPS_WORKER_DATA_PARTITION_H_
#define CSERPS_WORKER_DATA_PARTITION_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace cserps {

struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

// Rank `rank`'s share of [0, n). Sizes follow the largest-remainder
// (Hamilton) method: each rank first gets floor(n * b_r / sum(b)), then the
// examples left over go one each to the ranks with the largest remainders
// (n * b_r mod sum(b)), ties to the lower rank. So each size is within one
// example of the exact proportion, and the ranges are disjoint and cover
// [0, n) exactly.
// Preconditions (checked; the job config is validated before this is
// called): batch_sizes non-empty, every entry > 0, rank < batch_sizes.size().
Range RankRange(size_t n, absl::Span<const uint32_t> batch_sizes, size_t rank);

// Steps per epoch that every rank can do with full batches:
// min over r of floor(RankRange(n, batch_sizes, r).size() / batch_sizes[r]).
// Same preconditions as RankRange.
size_t StepsPerEpoch(size_t n, absl::Span<const uint32_t> batch_sizes);

}  // namespace cserps

#endif  // CSERPS_WORKER_DATA_PARTITION_H_
