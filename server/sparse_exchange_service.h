// The SparseExchange gRPC service of one shard (docs/protocol.md, Section
// 14): the sparse top-k rounds of gtopk-ssgd and topk-ssgd. Callback API: a
// push waiting for its round parks a reactor, not a thread; every reactor
// is finished exactly once. On a completed round the shard applies the
// workers' update to its model (ShardStore) before any member is answered:
// x -= sum / P on the selected indices, or with optimizer momentum the same
// momentum step the workers take (docs/algorithms.md), so that the servers
// always hold the workers' common model. Jobs of other algorithms get
// FAILED_PRECONDITION.
#ifndef CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_
#define CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/direction.h"
#include "common/traffic_counter.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "server/expiry_thread.h"
#include "server/service_traffic.h"
#include "server/service_options.h"
#include "server/shard_checkpoint.h"
#include "server/shard_context.h"
#include "server/sparse_aggregate.h"
#include "server/sparse_round_table.h"

namespace cserps {

class SparseExchangeService final : public v1::SparseExchange::CallbackService {
 public:
  // Its expiry thread, only for sparse jobs, fails overdue rounds.
  using Options = ShardServiceOptions;

  // `shard` outlives the service. For a gtopk-ssgd or topk-ssgd job,
  // INVALID_ARGUMENT when the model has more than 2^32 floats (indices are
  // uint32) or when a push or reply of k_s entries would not fit
  // cluster.max_message_bytes (docs/protocol.md 14.3).
  static absl::StatusOr<std::unique_ptr<SparseExchangeService>> Create(
      ShardContext* shard, Options options = {});
  ~SparseExchangeService() override;

  // Answers every parked call with UNAVAILABLE and refuses new ones; called
  // before grpc::Server::Shutdown. Idempotent.
  void Shutdown();

  // Fails the rounds overdue at `now`; returns how many.
  int ExpireOverdueRounds(absl::Time now) { return rounds_.ExpireOverdue(now); }
  // Waits until at least `count` SparsePushPull calls wait in open rounds;
  // false on timeout.
  bool WaitForWaitingCalls(size_t count, absl::Duration timeout) const {
    return rounds_.WaitForWaitingCalls(count, timeout);
  }

  // This shard's k_s (0 for a job that does not use the exchange).
  uint64_t shard_k() const { return k_s_; }

  // The servers' momentum (optimizer momentum of a sparse job), which a
  // checkpoint of the shard holds as section kMomentumSection; a shard
  // resumed from one starts with it.
  static constexpr char kMomentumSection[] = "sparse_momentum";
  bool checkpoints_momentum() const { return sparse_job_ && UsesMomentum(rule_.kind); }
  // The shard goes back to the checkpoint of `step` in place
  // (ParameterServerService::RollBack): open sparse rounds are aborted with
  // `reason`, and with none completing or opened, `reload` loads the model
  // and answers the checkpoint's other sections; the servers' momentum is
  // then the checkpoint's, and the rounds start over from `step`.
  // `reload`'s error, or DATA_LOSS when the momentum section is missing or
  // of another size.
  absl::Status RollBack(uint64_t step, const std::string& reason, const CheckpointReload& reload);
  std::vector<float> MomentumForCheckpoint();

  // What the service counts, for metrics (docs/metrics.md, stream "sparse").
  struct Counters {
    uint64_t rounds_completed = 0;
    uint64_t rounds_failed = 0;  // timed out, or failed at shutdown
    uint64_t open_rounds = 0;
    uint64_t newest_step = 0;  // of any completed round; 0 before the first
    // SparsePushPull requests that passed the checks and were handed to
    // their round, and the replies carrying a round's result.
    TrafficCounts traffic;
    // Requests refused before their round (no reply bytes are counted).
    TrafficCounts refused;
  };
  Counters counters() const;

  // `observer` is called once per completed round with the time from its
  // first push to the push that completed it (clock Options::now); for
  // metrics. Call before the service receives calls.
  void SetRoundLatencyObserver(std::function<void(absl::Duration)> observer) {
    on_round_latency_ = std::move(observer);
  }

  grpc::ServerUnaryReactor* SparsePushPull(grpc::CallbackServerContext* context,
                                           const v1::SparsePushPullRequest* request,
                                           v1::SparsePushPullResponse* response) override;

  // A push that came over the bulk transport (docs/protocol.md 17), whose
  // connection's hello authenticated it: SparsePushPull's checks, messages
  // and round. `done` is called once, with the round's reply or the
  // refusal. `request_bytes`, and a reply's entries plus `reply_overhead`,
  // count as the service's traffic.
  struct PushHead {
    uint64_t fingerprint = 0;
    uint32_t rank = 0;
    uint64_t step = 0;
    uint64_t k = 0;
  };
  void Push(const PushHead& head, SparseVector entries, uint64_t request_bytes,
            uint64_t reply_overhead, SparseRoundCallback done);

 private:
  SparseExchangeService(ShardContext* shard, Options options, bool sparse_job,
                        uint64_t k_s);

  // "SparsePushPull (step T) from rank R to shard S", the prefix of every
  // refusal of the push.
  std::string CallName(const PushHead& head) const;
  // The checks before a push's entries (docs/protocol.md 14.4).
  absl::Status Admit(const PushHead& head, absl::Time arrived);
  // Adds admitted, checked entries to their round; `done` gets the reply or
  // the round's error, prefixed with `name`.
  void JoinRound(const PushHead& head, SparseVector entries, absl::Time arrived,
                 uint64_t request_bytes, std::string name, SparseRoundCallback done);

  // Sums and selects, applies the result to the model, encodes the reply.
  SparseReply CompleteRound(std::vector<SparseVector> pushes);

  ShardContext& shard_;
  const Options options_;
  const bool sparse_job_;
  const SparseSelection selection_;
  const uint64_t k_s_;
  const DirectionRule rule_;

  // Guards the shard's momentum buffer. Rounds complete in step order, so
  // the momentum's updates follow the model's.
  absl::Mutex apply_mu_;
  std::vector<float> momentum_ ABSL_GUARDED_BY(apply_mu_);
  // A round's u over the shard (with momentum only): zero between rounds,
  // so a round writes and clears only its selected entries.
  std::vector<float> update_ ABSL_GUARDED_BY(apply_mu_);

  std::function<void(absl::Duration)> on_round_latency_;
  SparseRoundTable rounds_;

  ServiceTraffic traffic_;

  std::atomic<bool> shut_down_{false};
  // Last: destroyed (joined) first, while what it calls still exists.
  std::unique_ptr<ExpiryThread> expiry_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SPARSE_EXCHANGE_SERVICE_H_
