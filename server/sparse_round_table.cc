#include "server/sparse_round_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/round_lifecycle_impl.h"

namespace cserps {

template class RoundLifecycle<SparsePushes>;

SparsePushes::SparsePushes(const SparseVector& /*first*/, uint32_t world_size)
    : pushes_(world_size) {}

void SparsePushes::Add(uint32_t rank, SparseVector push) { pushes_[rank] = std::move(push); }

std::string SparsePushes::RoundName(uint64_t step) {
  return absl::StrCat("sparse round of step ", step);
}

std::string SparsePushes::PushName(uint64_t step, uint32_t rank) {
  return absl::StrCat("sparse push of rank ", rank, " for step ", step);
}

std::string SparsePushes::StepName(uint64_t step) { return absl::StrCat("step ", step); }

SparseRoundTable::SparseRoundTable(Options options)
    : RoundLifecycle(options.limits,
                     [this](uint64_t step, SparsePushes pushes, absl::Duration latency) {
                       return Finish(step, std::move(pushes), latency);
                     }),
      complete_(std::move(options.complete)),
      on_latency_(std::move(options.on_latency)) {
  CSERPS_CHECK(complete_ != nullptr);
}

void SparseRoundTable::Push(uint64_t step, uint32_t rank, SparseVector entries,
                            absl::Time now, SparseRoundCallback done, CountPush count) {
  Contribute(step, rank, std::move(entries), now, std::move(done), count);
}

SparseRoundReply SparseRoundTable::Finish(uint64_t step, SparsePushes pushes,
                                          absl::Duration latency) const {
  SparseRoundReply reply = std::make_shared<const SparseReply>(complete_(step, pushes.Take()));
  if (on_latency_) on_latency_(latency);
  return reply;
}

}  // namespace cserps
