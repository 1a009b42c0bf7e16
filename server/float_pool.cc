#include "server/float_pool.h"

namespace cserps {

std::shared_ptr<MeanValues> FloatPool::Get(size_t n) {
  std::unique_ptr<MeanValues> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(n);
    if (it != free_.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      free_bytes_ -= n * sizeof(float);
    }
  }
  if (buffer == nullptr) buffer = std::make_unique<MeanValues>(n);
  return std::shared_ptr<MeanValues>(buffer.release(), [this](MeanValues* b) { Put(b); });
}

void FloatPool::Put(MeanValues* buffer) {
  std::unique_ptr<MeanValues> owned(buffer);
  const size_t bytes = owned->size() * sizeof(float);
  absl::MutexLock lock(&mu_);
  if (free_bytes_ + bytes > max_free_bytes_) return;  // freed, outside the lock
  free_bytes_ += bytes;
  free_[owned->size()].push_back(std::move(owned));
}

size_t FloatPool::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

FloatPool& FloatPool::Shared() {
  static FloatPool* const pool = new FloatPool(size_t{256} << 20);
  return *pool;
}

}  // namespace cserps
