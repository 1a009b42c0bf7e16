// Float buffers that a shard's rounds reuse. Each round used to take its
// pushes' and its mean's floats from the heap and give them back at its
// end, and in rounds of many MiB the next round wrote into pages the
// process had to fault in again (docs/decisions.md). A buffer let go
// returns here instead and is handed out again, newest first, while it is
// still in cache, for any size up to its capacity: a power of two of
// floats, so that the payloads of GRBS rounds, whose sizes vary from step
// to step, share buffers. Thread-safe.
#ifndef CSERPS_SERVER_FLOAT_POOL_H_
#define CSERPS_SERVER_FLOAT_POOL_H_

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
using MeanValues = std::vector<float, UninitialisedAllocator<float>>;

class FloatPool {
 public:
  // Keeps at most `max_free_bytes` of free buffers; more let go are freed.
  explicit FloatPool(size_t max_free_bytes) : max_free_bytes_(max_free_bytes) {}
  FloatPool(const FloatPool&) = delete;
  FloatPool& operator=(const FloatPool&) = delete;

  // `n` floats, uninitialised, that come back to this pool when the last
  // owner lets go; the pool must outlive them.
  std::shared_ptr<MeanValues> Get(size_t n);

  // Of the free buffers' capacities.
  size_t free_bytes() const;

  // The servers' pool: 256 MiB free at most, the buffers of a 64 MiB
  // round of two members (kept alive for its whole length); never
  // destroyed, since a reply may hold a buffer until the process exits.
  static FloatPool& Shared();

 private:
  void Put(MeanValues* buffer);

  const size_t max_free_bytes_;
  mutable absl::Mutex mu_;
  // By capacity in floats, newest last.
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<MeanValues>>> free_
      ABSL_GUARDED_BY(mu_);
  size_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_FLOAT_POOL_H_
