// Asynchronous SGD (ALGORITHMS.md, "Asynchronous SGD"; docs/algorithms.md).
// The servers own the momentum and the update; the worker only computes g
// at its copy of the model and replaces the copy by the servers' answer, so
// both cross to the host every step.
#include <vector>

#include "common/status.h"
#include "worker/algorithms/factories.h"

namespace cserps {
namespace {

class AsyncSgd final : public Algorithm {
 public:
  explicit AsyncSgd(const AlgorithmContext& context)
      : Algorithm(context, {}, {}, /*staging_devices=*/0),
        grad_(context.ops->num_params()),
        model_(context.ops->num_params()) {}

  // The servers keep the momentum: no buffer here.
  absl::Status Init() override { return absl::OkStatus(); }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    // No barrier: the servers apply x ← x − η·Direction(g) at once and
    // answer with their model, which already holds what the others pushed.
    RETURN_IF_ERROR(ops().Download(g, absl::MakeSpan(grad_)));
    RETURN_IF_ERROR(comm().AsyncPushPull(t, lr, grad_, absl::MakeSpan(model_)));
    return ops().Upload(model_, x);
  }

  // A MODEL average would set the servers' model to the mean of stale local
  // copies and drop the other workers' latest pushes: each worker reads the
  // servers' model instead, which is final once every worker has finished.
  absl::Status Finish(uint64_t, float* x) override {
    RETURN_IF_ERROR(comm().PullModel(absl::MakeSpan(model_), /*wait_for_init=*/false));
    return ops().Upload(model_, x);
  }

 private:
  std::vector<float> grad_;
  std::vector<float> model_;
};

}  // namespace

std::unique_ptr<Algorithm> MakeAsyncSgd(const AlgorithmContext& context) {
  return std::make_unique<AsyncSgd>(context);
}

}  // namespace cserps
