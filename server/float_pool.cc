#include "server/float_pool.h"

namespace cserps {
namespace {

// The capacity a buffer of n floats gets: the least power of two >= n.
size_t Capacity(size_t n) {
  size_t c = 1;
  while (c < n) c <<= 1;
  return c;
}

}  // namespace

std::shared_ptr<MeanValues> FloatPool::Get(size_t n) {
  const size_t capacity = Capacity(n);
  std::unique_ptr<MeanValues> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      free_bytes_ -= capacity * sizeof(float);
    }
  }
  if (buffer == nullptr) {
    buffer = std::make_unique<MeanValues>();
    buffer->reserve(capacity);
  }
  buffer->resize(n);  // within its capacity: neither moved nor written
  return std::shared_ptr<MeanValues>(buffer.release(), [this](MeanValues* b) { Put(b); });
}

void FloatPool::Put(MeanValues* buffer) {
  std::unique_ptr<MeanValues> owned(buffer);
  const size_t bytes = owned->capacity() * sizeof(float);
  absl::MutexLock lock(&mu_);
  if (free_bytes_ + bytes > max_free_bytes_) return;  // freed, outside the lock
  free_bytes_ += bytes;
  free_[owned->capacity()].push_back(std::move(owned));
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
