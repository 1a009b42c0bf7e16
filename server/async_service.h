// The AsyncParameterServer gRPC service of one shard (docs/protocol.md,
// "Asynchronous SGD"): AsyncPushPull applies x <- x - lr * Direction(g) to a
// chunk of the shard at once, with one server-side momentum buffer per shard
// (optimizer.momentum_kind, momentum, weight_decay; the rule of
// common/direction.h, evaluated at x as it is when the push is
// applied), and answers with the updated chunk. algorithm.staleness bounds
// how far a rank may run ahead of the slowest live one
// (server/async_staleness_gate.h): such a push parks its reactor, no thread.
// Pushes over the bulk transport (Push) take the same checks, gate and
// update.
//
// Pushes are applied one at a time per shard. Dense rounds (PushPull) must
// not write the same floats concurrently; async-sgd uses none while training.
#ifndef CSERPS_SERVER_ASYNC_SERVICE_H_
#define CSERPS_SERVER_ASYNC_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/traffic_counter.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "server/async_staleness_gate.h"
#include "server/expiry_thread.h"
#include "server/round_table.h"
#include "server/service_traffic.h"
#include "server/service_options.h"
#include "server/shard_context.h"

namespace cserps {

class AsyncService final : public v1::AsyncParameterServer::CallbackService {
 public:
  // Its clock also drives the liveness rule; its expiry thread declares
  // silent ranks dead.
  using Options = ShardServiceOptions;

  // `shard` outlives the service.
  static absl::StatusOr<std::unique_ptr<AsyncService>> Create(ShardContext* shard,
                                                              Options options = {});
  ~AsyncService() override;

  // Answers every parked call with UNAVAILABLE and refuses new ones; called
  // before grpc::Server::Shutdown.
  void Shutdown();

  // Declares the ranks silent for cluster.round_timeout_s at `now` dead and
  // releases the pushes they held back; returns how many ranks.
  int ExpireSilentRanks(absl::Time now) { return gate_.ExpireSilentRanks(now); }

  // Pushes waiting for the slowest rank. WaitForParkedPushes waits (no
  // polling) until at least `count` are parked; false on timeout.
  size_t parked_pushes() const { return gate_.parked(); }
  bool WaitForParkedPushes(size_t count, absl::Duration timeout) const {
    return gate_.WaitForParked(count, timeout);
  }

  // What the service counts, for metrics (docs/metrics.md, stream "async").
  struct Counters {
    // Pushes applied to the model; a retry, answered without being applied
    // again, is not counted.
    uint64_t pushes_applied = 0;
    // Pushes that passed the checks but were never applied: failed at
    // shutdown while parked, or by an error applying them.
    uint64_t pushes_failed = 0;
    uint64_t newest_step = 0;  // of any applied push; 0 before the first
    // AsyncPushPull requests that passed the checks and reached the
    // staleness gate, and the replies carrying the updated chunk.
    TrafficCounts traffic;
    // Requests refused before the gate (no reply bytes are counted).
    TrafficCounts refused;
  };
  Counters counters() const;

  grpc::ServerUnaryReactor* AsyncPushPull(grpc::CallbackServerContext* context,
                                          const v1::AsyncPushPullRequest* request,
                                          v1::AsyncPushPullResponse* response) override;

  // A push that came over the bulk transport (docs/protocol.md 17), whose
  // connection's hello authenticated it: AsyncPushPull's checks, messages,
  // gate and update. `gradient` (count floats) is the service's to
  // overwrite. `done` is called once, with the chunk's model right after
  // the push or the refusal. `request_bytes`, and a reply's floats plus
  // `reply_overhead`, count as the service's traffic.
  struct PushHead {
    uint64_t fingerprint = 0;
    uint32_t rank = 0;
    uint64_t step = 0;
    float lr = 0;
    uint64_t offset = 0;  // global float index of the chunk
    uint64_t count = 0;   // its floats
  };
  using ModelReply = std::function<void(absl::StatusOr<RoundMean>)>;
  void Push(const PushHead& head, std::shared_ptr<float[]> gradient, uint64_t request_bytes,
            uint64_t reply_overhead, ModelReply done);

 private:
  AsyncService(ShardContext* shard, Options options);

  // The checks before the gate (sender, push), and the start of its call.
  absl::Status Admit(const PushHead& head, absl::Time arrived);
  // Checks everything but the sender (fingerprint, membership) and the
  // staleness bound.
  absl::Status Validate(const PushHead& head) const;
  // Parks the admitted push at the gate; once released, `apply` updates the
  // model and returns the reply's bytes, and `finish` gets the outcome,
  // prefixed with the push's name. A retry of a push applied already passes
  // at once: it only reads the floats back.
  void PassGate(const PushHead& head, absl::Time arrived,
                std::function<absl::StatusOr<uint64_t>()> apply,
                std::function<void(absl::Status)> finish);
  // Applies the push of gradient `g` (overwritten with the direction)
  // unless it is a retry, then calls `read` for the reply, under the same
  // lock.
  absl::Status Apply(const PushHead& head, absl::Span<float> g,
                     absl::FunctionRef<absl::Status()> read);
  // Whether `head`'s push was applied: the newest step applied for its
  // rank and offset is its step.
  bool Applied(const PushHead& head);
  // FAILED_PRECONDITION when a newer step of `head`'s rank and offset was
  // applied: only a step used again gets here (a retry is of the newest).
  absl::Status CheckNotReusedLocked(const PushHead& head) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);

  ShardContext& shard_;
  const Options options_;
  // Whether the job's algorithm is async-sgd: only its workers may push.
  const bool async_job_;
  StalenessGate gate_;

  absl::Mutex update_mu_;
  // Over the shard's floats; empty for momentum NONE.
  std::vector<float> momentum_ ABSL_GUARDED_BY(update_mu_);
  // (rank, offset) -> newest step applied: a push at that step is a retry,
  // an older one refused.
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint64_t> applied_
      ABSL_GUARDED_BY(update_mu_);

  std::atomic<uint64_t> pushes_applied_{0};
  std::atomic<uint64_t> pushes_failed_{0};
  // Written under update_mu_ only.
  std::atomic<uint64_t> newest_step_{0};
  ServiceTraffic traffic_;

  std::atomic<bool> shut_down_{false};
  // Last: destroyed (joined) first, while what it calls still exists.
  std::unique_ptr<ExpiryThread> expiry_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_ASYNC_SERVICE_H_
