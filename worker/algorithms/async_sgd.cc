// Asynchronous SGD (ALGORITHMS.md, "Asynchronous SGD"; docs/algorithms.md).
// The servers own the momentum and the update; the worker only computes g at
// its copy of the model and replaces the copy by the servers' answer.
#include "common/status.h"
#include "worker/algorithms/factories.h"
#include "worker/ps_client.h"

namespace cserps {
namespace {

class AsyncSgd final : public Algorithm {
 public:
  AsyncSgd(const AlgorithmContext& context, PsClient* client)
      : Algorithm(context), client_(*client) {}

  absl::Status Step(uint64_t t, float lr, absl::Span<const float> g,
                    absl::Span<float> x) override {
    // No barrier: the servers apply x ← x − η·Direction(g) at once and answer
    // with their model, which already holds whatever the others pushed.
    return client_.AsyncPushPull(t, lr, g, x);
  }

  // A MODEL average would set the servers' model to the mean of stale local
  // copies and drop the other workers' latest pushes: each worker reads the
  // servers' model instead, which is final once every worker has finished.
  absl::Status Finish(uint64_t, absl::Span<float> x) override {
    return client_.PullModel(x, /*wait_for_init=*/false);
  }

 private:
  PsClient& client_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Algorithm>> MakeAsyncSgd(const AlgorithmContext& context) {
  auto* client = dynamic_cast<PsClient*>(context.comm);
  if (client == nullptr) {
    return absl::FailedPreconditionError(
        "algorithm.name: async-sgd needs the parameter-server client (PsClient) "
        "as its communicator: it uses AsyncPushPull, which Communicator lacks");
  }
  return std::unique_ptr<Algorithm>(new AsyncSgd(context, client));
}

}  // namespace cserps
