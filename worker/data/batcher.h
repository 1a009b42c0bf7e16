// Mini-batch sources over a Dataset: EpochBatcher for training (a rank's
// range, reshuffled every epoch, identically in every process that knows the
// job seed) and SequentialBatches for evaluation (the whole set, in order).
// Neither is thread-safe; each is used by one trainer thread.
#ifndef CSERPS_WORKER_DATA_BATCHER_H_
#define CSERPS_WORKER_DATA_BATCHER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/partition.h"

namespace cserps {

class EpochBatcher {
 public:
  // Serves batches of `batch_size` examples from `range` of `data`; `data`
  // must outlive the batcher and not change. Starts in epoch 0.
  // Preconditions (checked): batch_size > 0, range.begin <= range.end <=
  // data.size.
  EpochBatcher(const Dataset& data, Range range, size_t batch_size,
               uint64_t job_seed, uint32_t rank);

  EpochBatcher(const EpochBatcher&) = delete;
  EpochBatcher& operator=(const EpochBatcher&) = delete;

  // Reorders the range's examples by a permutation that depends only on
  // (job_seed, rank, epoch): Fisher-Yates with
  // CounterRng(DeriveKey(DeriveKey(job_seed, rank), epoch)), for i from
  // size-1 down to 1 swapping positions i and Below(i + 1), starting from
  // the range in order. Invalidates views returned by Get.
  void StartEpoch(uint64_t epoch);

  // Full batches per epoch: range.size() / batch_size; the remainder of the
  // range is skipped for that epoch (a different remainder each epoch).
  size_t batches_per_epoch() const { return order_.size() / batch_size_; }

  // Batch `index` (< batches_per_epoch(), checked) of the current epoch:
  // the examples at shuffled positions [index * batch_size, +batch_size),
  // copied into this batcher's buffers. The view stays valid until the next
  // Get or StartEpoch call or the batcher's destruction.
  Batch Get(size_t index);

 private:
  const Dataset& data_;
  const Range range_;
  const size_t batch_size_;
  const uint64_t rank_key_;
  std::vector<size_t> order_;  // dataset indices of the range, shuffled
  std::vector<float> features_;
  std::vector<uint8_t> labels_;
};

class SequentialBatches {
 public:
  // `data` must outlive this object and not change; batch_size > 0 (checked).
  SequentialBatches(const Dataset& data, size_t batch_size);

  // ceil(data.size / batch_size).
  size_t count() const;

  // Examples [index * batch_size, min(data.size, (index + 1) * batch_size))
  // for index < count() (checked); only the last batch may be short. The view
  // points into `data` and lives as long as it does.
  Batch Get(size_t index) const;

 private:
  const Dataset& data_;
  const size_t batch_size_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DATA_BATCHER_H_
