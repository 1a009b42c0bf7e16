#include "server/round_table.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/vector_clones.h"
#include "cserps/v1/parameter_server.pb.h"
#include "server/round_lifecycle_impl.h"

namespace cserps {

namespace {

// What the sum of a round holds before a push is added: nothing (0), the
// double sum, or a held first push h with its weight (0 + w_h h[i]).
struct Base {
  const double* sum = nullptr;
  const float* held = nullptr;
  double held_weight = 0.0;
};

Base BaseOf(const std::shared_ptr<UninitialisedVector<double>>& sum,
            const WeightedSum::Contribution& held) {
  return {sum != nullptr ? sum->data() : nullptr,
          held.keep != nullptr ? held.values.data() : nullptr, held.weight};
}

// out[i] = store(base[i] + w v[i]); v null: store(base[i]). Every case is
// its own loop, so that each vectorises. A sum starts from 0.0 + x, not x:
// a -0.0 sums to +0.0, as it did into a zeroed buffer. Always inlined, so
// that it is cloned with its callers (vector_clones.h).
template <typename Out, typename Store>
__attribute__((always_inline)) inline void WriteSum(const Base& base, double w, const float* v,
                                                    Store store, Out* out, size_t n) {
  if (base.held != nullptr) {
    const double wh = base.held_weight;
    const float* h = base.held;
    if (v == nullptr) {
      for (size_t i = 0; i < n; ++i) out[i] = store(0.0 + wh * static_cast<double>(h[i]));
    } else {
      for (size_t i = 0; i < n; ++i) {
        out[i] = store((0.0 + wh * static_cast<double>(h[i])) + w * static_cast<double>(v[i]));
      }
    }
  } else if (base.sum == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = store(0.0 + w * static_cast<double>(v[i]));
  } else if (v == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = store(base.sum[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = store(base.sum[i] + w * static_cast<double>(v[i]));
  }
}

// out[i] = float((base[i] + w v[i]) / total): the double division the mean
// is defined by. Where total is a power of two its reciprocal is exact, and
// x * (1 / total) rounds the same exact value once: the same bits, without
// a division per float.
CSERPS_VECTOR_CLONES
void WriteMean(const Base& base, double w, const float* v, double total, float* out,
               size_t n) {
  int exponent = 0;
  if (std::frexp(total, &exponent) == 0.5) {
    const double inverse = 1.0 / total;
    WriteSum(base, w, v, [inverse](double x) { return static_cast<float>(x * inverse); }, out,
             n);
  } else {
    WriteSum(base, w, v, [total](double x) { return static_cast<float>(x / total); }, out, n);
  }
}

// sum[i] += w v[i].
CSERPS_VECTOR_CLONES
void AddTo(double* sum, double w, const float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += w * static_cast<double>(v[i]);
}

// sum[i] = base[i] + w v[i].
CSERPS_VECTOR_CLONES
void WriteBaseSum(const Base& base, double w, const float* v, double* sum, size_t n) {
  WriteSum(base, w, v, [](double x) { return x; }, sum, n);
}

}  // namespace

template class RoundLifecycle<WeightedSum>;
static_assert(WeightedSum::kFullAverageStream == v1::CHECKPOINT);

WeightedSum::WeightedSum(const Contribution& first, uint32_t world_size)
    : size_(first.values.size()), world_size_(world_size), lr_(first.lr) {}

void WeightedSum::Add(uint32_t /*rank*/, const Contribution& push) {
  const double w = push.weight;
  const float* v = push.values.data();
  const bool first = added_ == 0;
  ++added_;
  const Base base = BaseOf(sum_, held_);
  if (added_ == world_size_) {
    // The round's last push: sum_i w_i v_i / sum_i w_i in one pass, the same
    // double operations in the same order as adding and then dividing.
    weight_total_ += w;
    auto mean = FloatPool::Shared().Get(size_);
    WriteMean(base, w, v, weight_total_, mean->data(), size_);
    mean_ = std::move(mean);
    held_ = Contribution();
    sum_.reset();
    return;
  }
  weight_total_ += w;
  if (first && push.keep != nullptr) {
    held_ = push;
    return;
  }
  if (sum_ == nullptr) sum_ = BufferPool<double>::Shared().Get(size_);  // written here
  double* sum = sum_->data();
  if (base.sum != nullptr) {
    AddTo(sum, w, v, size_);
  } else {
    WriteBaseSum(base, w, v, sum, size_);
  }
  held_ = Contribution();
}

RoundMean WeightedSum::Mean() const {
  if (mean_ != nullptr) return mean_;
  // An elastic round completed without some of the members it expected.
  CSERPS_CHECK(added_ > 0 && (sum_ != nullptr || held_.keep != nullptr));
  auto mean = FloatPool::Shared().Get(size_);
  WriteMean(BaseOf(sum_, held_), 0.0, nullptr, weight_total_, mean->data(), size_);
  return mean;
}

std::string StreamName(int stream) {
  return v1::Stream_IsValid(stream) ? v1::Stream_Name(stream) : absl::StrCat(stream);
}

std::string WeightedSum::RoundName(const RoundKey& key) {
  return absl::StrCat("round (step ", key.step, ", stream ", StreamName(key.stream),
                      ", chunk ", key.chunk,
                      key.ratio == 1 ? "" : absl::StrCat(", ratio ", key.ratio), ")");
}

std::string WeightedSum::PushName(const RoundKey& key, uint32_t rank) {
  return absl::StrCat("push of rank ", rank, " to ", RoundName(key));
}

std::string WeightedSum::StepName(const RoundKey& key) {
  return absl::StrCat("step ", key.step, " of stream ", StreamName(key.stream));
}

absl::Status WeightedSum::Check(const RoundKey& key, uint32_t rank,
                                const Contribution& push) {
  if (!std::isfinite(push.weight) || !(push.weight > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        PushName(key, rank), ": weight ", push.weight, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

absl::Status WeightedSum::CheckShape(const RoundKey& key, uint32_t rank, Shape got,
                                     Shape want) {
  if (got == want) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(PushName(key, rank), ": values length ", got,
                   " differs from the round's length ", want));
}

RoundTable::RoundTable(Options options)
    : RoundLifecycle(options.limits,
                     [this](const RoundKey& key, WeightedSum sum, absl::Duration latency) {
                       return Finish(key, sum, latency);
                     }),
      on_complete_(std::move(options.on_complete)),
      on_latency_(std::move(options.on_latency)) {}

void RoundTable::Push(const RoundKey& key, uint32_t rank, float weight, float lr,
                      absl::Span<const float> values, absl::Time now, RoundCallback done,
                      std::shared_ptr<const void> keep, CountPush count) {
  Contribute(key, rank, {weight, lr, values, std::move(keep)}, now, std::move(done), count);
}

RoundMean RoundTable::Finish(const RoundKey& key, const WeightedSum& sum,
                             absl::Duration latency) const {
  RoundMean mean = sum.Mean();
  if (on_complete_) on_complete_(key, sum.lr(), *mean);
  if (on_latency_) on_latency_(key, latency);
  return mean;
}

}  // namespace cserps
