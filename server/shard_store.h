// One shard's part of the global model: floats [first, first + size) of the
// flat model, and whether PushModel has written all of them yet.
//
// Thread safety: every method may be called from any thread; callbacks run
// without the store's lock held.
#ifndef CSERPS_SERVER_SHARD_STORE_H_
#define CSERPS_SERVER_SHARD_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/block_layout.h"

namespace cserps {

class ShardStore {
 public:
  using InitCallback = std::function<void(absl::Status)>;

  // At most `max_waiters` WhenInitialised calls wait at once.
  ShardStore(uint64_t first_float, uint64_t size, uint32_t max_waiters);

  uint64_t first_float() const { return first_; }
  uint64_t size() const { return size_; }

  // Writes `values` at global float `offset` (PushModel). OUT_OF_RANGE when
  // the range is not inside the shard. Returns whether every float of the
  // shard has now been written; the write that completes initialisation
  // answers the WhenInitialised waiters.
  absl::StatusOr<bool> Write(uint64_t offset, absl::Span<const float> values);

  // Appends floats [offset, offset + count) as little-endian bytes to `out`.
  absl::Status Read(uint64_t offset, uint64_t count, std::string* out) const;
  // Copies floats [offset, offset + out.size()) into `out`.
  absl::Status Read(uint64_t offset, absl::Span<float> out) const;

  // The updates below change the model in place, under the store's lock, so
  // that a concurrent Read sees all of one update or none of it. They do
  // not count as writes for initialisation (that is PushModel's), and on an
  // error nothing has changed.

  // x[indices[e]] -= deltas[e], for global float indices in any order
  // (a repeated index is subtracted from again). INVALID_ARGUMENT when the
  // spans differ in length; OUT_OF_RANGE, naming the index and its
  // position, when one is not inside the shard.
  absl::Status SubtractAt(absl::Span<const uint32_t> indices,
                          absl::Span<const float> deltas);

  // An asynchronous step over floats [offset, offset + p.size()):
  // `direction(x, p)` turns the gradient p into the direction at x as it
  // is, in place, then x -= lr * p (ApplyMean's GRAD rule), both under the
  // lock, without a copy of x. OUT_OF_RANGE when the range is not inside
  // the shard.
  absl::Status Step(uint64_t offset, float lr, absl::Span<float> p,
                    absl::FunctionRef<void(const float* x, absl::Span<float> p)> direction);

  // update(x), x the shard's floats (x[0] is float first_float()), under
  // the lock.
  void Update(absl::FunctionRef<void(absl::Span<float> x)> update);

  // Applies a round's mean for payload floats [begin, begin + mean.size()):
  // MODEL streams set x = mean, GRAD streams x -= lr * mean.
  void ApplyMean(bool is_model_stream, const ShardPayload& payload,
                 uint64_t begin, absl::Span<const float> mean, float lr);

  bool initialised() const;

  // Calls `done(OK)` once the shard is initialised (at once when it is), or
  // `done(reason)` when FailWaiters is called first. A waiter whose
  // `abandoned()` has become true (its caller gave up) is answered
  // CANCELLED when the waiters reach `max_waiters`, to make room; when they
  // still fill it, `done` gets RESOURCE_EXHAUSTED at once.
  void WhenInitialised(InitCallback done, std::function<bool()> abandoned);
  void FailWaiters(const absl::Status& reason);

 private:
  struct Waiter {
    InitCallback done;
    std::function<bool()> abandoned;
  };

  const uint64_t first_;
  const uint64_t size_;
  const uint32_t max_waiters_;
  mutable absl::Mutex mu_;
  std::vector<float> values_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> written_ ABSL_GUARDED_BY(mu_);
  uint64_t unwritten_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SHARD_STORE_H_
