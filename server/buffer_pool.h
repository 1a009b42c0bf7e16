// Buffers that a shard's rounds reuse. Each round used to take its
// pushes', its sum's and its mean's values from the heap and give them
// back at its end, and in rounds of many MiB the next round wrote into pages the
// process had to fault in again (docs/decisions.md). A buffer let go
// returns here instead and is handed out again, newest first, while it is
// still in cache, for any size up to its capacity: a power of two of
// values, so that the payloads of GRBS rounds, whose sizes vary from step
// to step, share buffers. Thread-safe.
#ifndef CSERPS_SERVER_BUFFER_POOL_H_
#define CSERPS_SERVER_BUFFER_POOL_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace cserps {

// Allocates like std::allocator, but leaves a resized vector's floats
// uninitialised: a round writes every float of its mean, so zeroing them
// first only cost time (a tenth of a shard's CPU in 4 MiB rounds).
template <typename T>
struct UninitialisedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  UninitialisedAllocator() = default;
  template <typename U>
  UninitialisedAllocator(const UninitialisedAllocator<U>&) noexcept {}  // NOLINT: as std::allocator
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// The capacity a buffer of n values gets: the least power of two >= n.
size_t PoolCapacity(size_t n);

template <typename T>
using UninitialisedVector = std::vector<T, UninitialisedAllocator<T>>;
using MeanValues = UninitialisedVector<float>;

template <typename T>
class BufferPool {
 public:
  using Buffer = UninitialisedVector<T>;

  // Keeps at most `max_free_bytes` of free buffers; more let go are freed.
  explicit BufferPool(size_t max_free_bytes) : max_free_bytes_(max_free_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // `n` values, uninitialised, that come back to this pool when the last
  // owner lets go; the pool must outlive them.
  std::shared_ptr<Buffer> Get(size_t n) {
    const size_t capacity = PoolCapacity(n);
    std::unique_ptr<Buffer> buffer;
    {
      absl::MutexLock lock(&mu_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        buffer = std::move(it->second.back());
        it->second.pop_back();
        free_bytes_ -= capacity * sizeof(T);
      }
    }
    if (buffer == nullptr) {
      buffer = std::make_unique<Buffer>();
      buffer->reserve(capacity);
    }
    buffer->resize(n);  // within its capacity: neither moved nor written
    return std::shared_ptr<Buffer>(buffer.release(), [this](Buffer* b) { Put(b); });
  }

  // Of the free buffers' capacities.
  size_t free_bytes() const {
    absl::MutexLock lock(&mu_);
    return free_bytes_;
  }

  // The servers' pool of T: 256 MiB free at most (of floats, the pushes
  // and mean of a 64 MiB round of two members, which live as long as the
  // round); never destroyed, since a reply may hold a buffer until the
  // process exits.
  static BufferPool& Shared() {
    static BufferPool* const pool = new BufferPool(size_t{256} << 20);
    return *pool;
  }

 private:
  void Put(Buffer* buffer) {
    std::unique_ptr<Buffer> owned(buffer);
    const size_t bytes = owned->capacity() * sizeof(T);
    absl::MutexLock lock(&mu_);
    if (free_bytes_ + bytes > max_free_bytes_) return;  // freed, outside the lock
    free_bytes_ += bytes;
    free_[owned->capacity()].push_back(std::move(owned));
  }

  const size_t max_free_bytes_;
  mutable absl::Mutex mu_;
  // By capacity, newest last.
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<Buffer>>> free_ ABSL_GUARDED_BY(mu_);
  size_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

using FloatPool = BufferPool<float>;

}  // namespace cserps

#endif  // CSERPS_SERVER_BUFFER_POOL_H_
