// A Communicator that hands every call to another: the base of wrappers
// that change or record some calls (a delayed network, a test's recording)
// and leave the rest as they are.
#ifndef CSERPS_WORKER_PS_FORWARDING_COMMUNICATOR_H_
#define CSERPS_WORKER_PS_FORWARDING_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/ps/communicator.h"

namespace cserps {

class ForwardingCommunicator : public Communicator {
 public:
  // `inner` outlives this.
  explicit ForwardingCommunicator(Communicator* inner) : inner_(inner) {}

  const BlockLayout& layout() const override { return inner_->layout(); }
  std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream, uint64_t step,
                                                      uint32_t ratio, float weight,
                                                      float lr) override {
    return inner_->BeginShardedAverage(stream, step, ratio, weight, lr);
  }
  absl::Status ExchangeSparse(uint64_t step, const SparseVector& local,
                              SparseVector* result) override {
    return inner_->ExchangeSparse(step, local, result);
  }
  absl::Status AsyncPushPull(uint64_t step, float lr, absl::Span<const float> grad,
                             absl::Span<float> model) override {
    return inner_->AsyncPushPull(step, lr, grad, model);
  }
  absl::Status PullModel(absl::Span<float> model, bool wait_for_init) override {
    return inner_->PullModel(model, wait_for_init);
  }

 private:
  Communicator* inner_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_FORWARDING_COMMUNICATOR_H_
