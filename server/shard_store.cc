#include "server/shard_store.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/direction.h"
#include "common/float_bytes.h"
#include "common/status.h"

namespace cserps {
namespace {

absl::Status CheckRange(uint64_t first, uint64_t size, uint64_t offset,
                        uint64_t count) {
  if (offset < first || offset - first > size || count > size - (offset - first)) {
    return absl::OutOfRangeError(absl::StrCat(
        "floats ",
        count <= UINT64_MAX - offset ? absl::StrCat("[", offset, ", ", offset + count, ")")
                                     : absl::StrCat("from ", offset, ", count ", count, ","),
        " are not inside this shard's [", first, ", ", first + size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

ShardStore::ShardStore(uint64_t first_float, uint64_t size, uint32_t max_waiters)
    : first_(first_float),
      size_(size),
      max_waiters_(max_waiters),
      values_(size, 0.0f),
      written_(size, false),
      unwritten_(size) {}

absl::StatusOr<bool> ShardStore::Write(uint64_t offset,
                                       absl::Span<const float> values) {
  RETURN_IF_ERROR(CheckRange(first_, size_, offset, values.size()));
  std::vector<Waiter> ready;
  bool initialised;
  {
    absl::MutexLock lock(&mu_);
    const bool was_initialised = unwritten_ == 0;
    const uint64_t base = offset - first_;
    for (size_t i = 0; i < values.size(); ++i) {
      values_[base + i] = values[i];
      if (!written_[base + i]) {
        written_[base + i] = true;
        --unwritten_;
      }
    }
    initialised = unwritten_ == 0;
    if (initialised && !was_initialised) ready.swap(waiters_);
  }
  for (Waiter& waiter : ready) waiter.done(absl::OkStatus());
  return initialised;
}

absl::Status ShardStore::Read(uint64_t offset, uint64_t count,
                              std::string* out) const {
  RETURN_IF_ERROR(CheckRange(first_, size_, offset, count));
  absl::MutexLock lock(&mu_);
  AppendFloats(absl::MakeConstSpan(values_).subspan(offset - first_, count), out);
  return absl::OkStatus();
}

absl::Status ShardStore::Read(uint64_t offset, absl::Span<float> out) const {
  RETURN_IF_ERROR(CheckRange(first_, size_, offset, out.size()));
  absl::MutexLock lock(&mu_);
  std::copy_n(values_.begin() + (offset - first_), out.size(), out.begin());
  return absl::OkStatus();
}

absl::Status ShardStore::Step(
    uint64_t offset, float lr, absl::Span<float> p,
    absl::FunctionRef<void(const float* x, absl::Span<float> p)> direction) {
  RETURN_IF_ERROR(CheckRange(first_, size_, offset, p.size()));
  absl::MutexLock lock(&mu_);
  float* const x = values_.data() + (offset - first_);
  direction(x, p);
  Descend(lr, p.size(), p.data(), x);
  return absl::OkStatus();
}

void ShardStore::Update(absl::FunctionRef<void(absl::Span<float> x)> update) {
  absl::MutexLock lock(&mu_);
  update(absl::MakeSpan(values_));
}

absl::Status ShardStore::SubtractAt(absl::Span<const uint32_t> indices,
                                    absl::Span<const float> deltas) {
  if (indices.size() != deltas.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        indices.size(), " indices but ", deltas.size(), " deltas"));
  }
  // One pass without a branch per index; a second names the first bad one.
  uint32_t outside = 0;
  for (uint32_t index : indices) outside |= index - first_ >= size_ ? 1 : 0;
  for (size_t e = 0; outside != 0 && e < indices.size(); ++e) {
    if (indices[e] < first_ || indices[e] - first_ >= size_) {
      return absl::OutOfRangeError(absl::StrCat(
          "index ", indices[e], " at position ", e, " is not inside this shard's [",
          first_, ", ", first_ + size_, ")"));
    }
  }
  absl::MutexLock lock(&mu_);
  for (size_t e = 0; e < indices.size(); ++e) values_[indices[e] - first_] -= deltas[e];
  return absl::OkStatus();
}

void ShardStore::ApplyMean(bool is_model_stream, const ShardPayload& payload,
                           uint64_t begin, absl::Span<const float> mean,
                           float lr) {
  absl::MutexLock lock(&mu_);
  float* const shard = values_.data();  // the lambda runs under the lock
  payload.ForEachPiece(begin, mean.size(), [&](uint64_t m, uint64_t p, uint64_t n) {
    float* x = shard + (m - first_);
    const float* v = mean.data() + (p - begin);
    if (is_model_stream) {
      // glibc's memcpy writes a large copy's cache lines whole, without
      // reading the model's old lines first as a loop's stores do.
      std::memcpy(x, v, n * sizeof(float));
    } else {
      Descend(lr, n, v, x);
    }
  });
}

bool ShardStore::initialised() const {
  absl::MutexLock lock(&mu_);
  return unwritten_ == 0;
}

void ShardStore::WhenInitialised(InitCallback done, std::function<bool()> abandoned) {
  absl::Status status;
  bool waiting_now = false;
  std::vector<Waiter> given_up;
  {
    absl::MutexLock lock(&mu_);
    if (unwritten_ != 0 && failed_.ok()) {
      if (waiters_.size() >= max_waiters_) {
        auto waiting = std::stable_partition(
            waiters_.begin(), waiters_.end(),
            [](const Waiter& waiter) { return !waiter.abandoned(); });
        std::move(waiting, waiters_.end(), std::back_inserter(given_up));
        waiters_.erase(waiting, waiters_.end());
      }
      if (waiters_.size() < max_waiters_) {
        waiters_.push_back({std::move(done), std::move(abandoned)});
        waiting_now = true;
      } else {
        status = absl::ResourceExhaustedError(absl::StrCat(
            max_waiters_, " calls already wait for this shard's model (rank 0 "
            "initialises it with PushModel)"));
      }
    } else {
      status = failed_;
    }
  }
  for (Waiter& waiter : given_up) {
    waiter.done(absl::CancelledError("the caller gave up waiting for the model"));
  }
  if (!waiting_now) done(status);
}

void ShardStore::FailWaiters(const absl::Status& reason) {
  std::vector<Waiter> waiting;
  {
    absl::MutexLock lock(&mu_);
    failed_ = reason;
    waiting.swap(waiters_);
  }
  for (Waiter& waiter : waiting) waiter.done(reason);
}

}  // namespace cserps
