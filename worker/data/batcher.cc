#include "worker/data/batcher.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "common/prng.h"
#include "common/status.h"

namespace cserps {

EpochBatcher::EpochBatcher(const Dataset& data, Range range, size_t batch_size,
                           uint64_t job_seed, uint32_t rank)
    : data_(data),
      range_(range),
      batch_size_(batch_size),
      rank_key_(DeriveKey(job_seed, rank)),
      features_(batch_size * data.dim),
      labels_(batch_size) {
  CSERPS_CHECK(batch_size > 0);
  CSERPS_CHECK(range.begin <= range.end && range.end <= data.size);
  order_.resize(range.size());
  StartEpoch(0);
}

void EpochBatcher::StartEpoch(uint64_t epoch) {
  // Restart from the range in order so the permutation depends on the epoch
  // alone, not on which epochs ran before.
  std::iota(order_.begin(), order_.end(), range_.begin);
  CounterRng rng(DeriveKey(rank_key_, epoch));
  for (size_t i = order_.size(); i > 1; --i) {
    std::swap(order_[i - 1], order_[rng.Below(i)]);
  }
}

Batch EpochBatcher::Get(size_t index) {
  CSERPS_CHECK(index < batches_per_epoch());
  const size_t dim = data_.dim;
  for (size_t k = 0; k < batch_size_; ++k) {
    const size_t example = order_[index * batch_size_ + k];
    std::copy_n(data_.features.begin() + example * dim, dim,
                features_.begin() + k * dim);
    labels_[k] = data_.labels[example];
  }
  Batch batch;
  batch.features = features_;
  batch.labels = labels_;
  batch.size = batch_size_;
  batch.dim = dim;
  return batch;
}

SequentialBatches::SequentialBatches(const Dataset& data, size_t batch_size)
    : data_(data), batch_size_(batch_size) {
  CSERPS_CHECK(batch_size > 0);
}

size_t SequentialBatches::count() const {
  return (data_.size + batch_size_ - 1) / batch_size_;
}

Batch SequentialBatches::Get(size_t index) const {
  CSERPS_CHECK(index < count());
  const size_t begin = index * batch_size_;
  const size_t size = std::min(batch_size_, data_.size - begin);
  Batch batch;
  batch.features = absl::MakeConstSpan(
      data_.features.data() + begin * data_.dim, size * data_.dim);
  batch.labels = absl::MakeConstSpan(data_.labels.data() + begin, size);
  batch.size = size;
  batch.dim = data_.dim;
  return batch;
}

}  // namespace cserps
