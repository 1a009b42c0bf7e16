// The gRPC ParameterServer service of one shard (docs/protocol.md). Uses the
// callback API: a PushPull waiting for its round parks a reactor, not a
// thread. No exception escapes a handler; every refusal is a gRPC status
// whose message says what is wrong.
#ifndef CSERPS_SERVER_PARAMETER_SERVER_SERVICE_H_
#define CSERPS_SERVER_PARAMETER_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/block_layout.h"
#include "common/traffic_counter.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "server/expiry_thread.h"
#include "server/member_registry.h"
#include "server/payload_cache.h"
#include "server/round_table.h"
#include "server/service_options.h"
#include "server/shard_checkpoint.h"
#include "server/shard_context.h"
#include "server/shard_store.h"

namespace cserps {

class ParameterServerService final : public v1::ParameterServer::CallbackService {
 public:
  // Its expiry thread fails overdue rounds.
  using Options = ShardServiceOptions;

  // The service's counters, as GetStatus reports them.
  struct Counters {
    uint64_t registered = 0;
    uint64_t rounds_completed = 0;
    uint64_t rounds_failed = 0;
    uint64_t grad_rounds_completed = 0, grad_rounds_failed = 0;
    uint64_t model_rounds_completed = 0, model_rounds_failed = 0;
    uint64_t checkpoint_rounds_completed = 0, checkpoint_rounds_failed = 0;
    uint64_t checkpoints_written = 0;
    uint64_t open_rounds = 0;
    uint64_t newest_step = 0;
    // Every request (PushModel included) and every reply (PullModel
    // included).
    TrafficCounts traffic;
    // PushPull requests that reached their round, by stream, and the
    // replies carrying a round's mean.
    TrafficCounts grad, model, checkpoint;
    // Ranks an elastic job dropped on this shard, and admitted back.
    uint64_t dropped = 0;
    uint64_t admitted = 0;
    // The rest, counted where it happens (not as a difference, so that it
    // never goes down): PushModel requests and refused PushPull requests;
    // PullModel replies.
    TrafficCounts other;
  };

  // Starts the expiry thread when asked. `shard` outlives the service.
  static absl::StatusOr<std::unique_ptr<ParameterServerService>> Create(
      ShardContext* shard, Options options = {});
  ~ParameterServerService() override;

  // Fails every parked call with UNAVAILABLE and refuses new rounds; call
  // before grpc::Server::Shutdown so that no reactor stays parked.
  void Shutdown();
  // A roll back failed: the service has shut down and the shard's model is
  // neither its rounds' nor its checkpoint's, so the process must end.
  bool roll_back_failed() const { return roll_back_failed_.load(); }

  // Fails the rounds overdue at `now`; returns how many.
  int ExpireOverdueRounds(absl::Time now) { return rounds_.ExpireOverdue(now); }
  // Waits until at least `count` PushPull calls wait in open rounds; false
  // on timeout.
  bool WaitForWaitingCalls(size_t count, absl::Duration timeout) const {
    return rounds_.WaitForWaitingCalls(count, timeout);
  }

  Counters counters() const;

  // `observer` is called once per completed round with the time from its
  // first push to the push that completed it (clock Options::now); for
  // metrics. Call before the service receives calls.
  void SetRoundLatencyObserver(
      std::function<void(const RoundKey&, absl::Duration)> observer) {
    on_round_latency_ = std::move(observer);
  }

  // A PushPull from either transport (gRPC, or server/bulk_server.h): the
  // fields of docs/protocol.md 8.2 but the values.
  struct PushPullHead {
    uint64_t fingerprint = 0;
    uint32_t rank = 0;
    uint64_t step = 0;
    int stream = 0;
    uint32_t ratio = 1;
    uint32_t chunk = 0;
    float weight = 1;
    float lr = 0;
  };
  // The services' clock (Options::now), which every transport stamps its
  // requests' arrival with.
  absl::Time Now() const { return options_.now(); }
  // "PushPull (step 3, stream GRAD, chunk 0) from rank 1": what refusals
  // and failed rounds are prefixed with.
  static std::string CallName(const PushPullHead& head);
  // Admits `head`, arrived at `arrived`, and returns how many floats its
  // chunk carries; else the refusal, prefixed with CallName.
  absl::StatusOr<size_t> AdmitPushPull(const PushPullHead& head, absl::Time arrived);
  // Adds the values of an admitted head to its round; `done` and `keep` as
  // RoundTable::Push, errors prefixed with CallName.
  void JoinRound(const PushPullHead& head, absl::Span<const float> values,
                 uint64_t request_bytes, absl::Time arrived, RoundCallback done,
                 std::shared_ptr<const void> keep = nullptr);
  // The transports count every request, the refused ones, and the replies
  // of rounds.
  void CountRequest(uint64_t bytes) { traffic_.AddRequest(bytes); }
  void CountRefused(uint64_t bytes) { other_traffic_.AddRequest(bytes); }
  void CountReply(int stream, uint64_t bytes);

  // The members the rounds wait for (num_workers until an elastic job
  // drops one), which every reply carries.
  uint32_t members() const { return rounds_.members(); }

  // The other services' roll back: called by RollBack with the
  // checkpoint's step, the reason and `reload` (which loads the model with
  // this service's rounds stopped too), it stops their rounds, runs
  // `reload` and takes its sections. Set before the service receives calls.
  void set_on_roll_back(
      std::function<absl::Status(uint64_t, const std::string&, const CheckpointReload&)> f) {
    on_roll_back_ = std::move(f);
  }

  // The traffic of the shard's other services (the sparse exchange,
  // asynchronous SGD), which GetStatus's bytes_in and bytes_out count too.
  // Set before the service receives calls.
  void set_other_services_traffic(std::function<TrafficCounts()> f) {
    other_services_traffic_ = std::move(f);
  }

  // The port Register advertises for the bulk transport (0: none). Set
  // before the service receives calls.
  void set_bulk_port(uint32_t port) { bulk_port_ = port; }

  // The shard's part in the full averages (checkpoints, admissions); null
  // when the job takes none. Sections of other services are added before
  // the service receives calls.
  ShardCheckpoint* checkpoint() { return checkpoint_.get(); }

  const BlockLayout& layout() const { return layout_; }
  uint32_t shard() const { return shard_.shard(); }
  uint64_t fingerprint() const { return shard_.fingerprint(); }

  // The service's calls (docs/protocol.md).
  using Reactor = grpc::ServerUnaryReactor;
  using Context = grpc::CallbackServerContext;
  Reactor* Register(Context*, const v1::RegisterRequest*, v1::RegisterResponse*) override;
  Reactor* PushPull(Context*, const v1::PushPullRequest*, v1::PushPullResponse*) override;
  Reactor* PullModel(Context*, const v1::PullModelRequest*, v1::PullModelResponse*) override;
  Reactor* PushModel(Context*, const v1::PushModelRequest*, v1::PushModelResponse*) override;
  Reactor* GetStatus(Context*, const v1::GetStatusRequest*, v1::GetStatusResponse*) override;
  Reactor* Rejoin(Context*, const v1::RejoinRequest*, v1::RejoinResponse*) override;
  Reactor* RollBack(Context*, const v1::RollBackRequest*, v1::RollBackResponse*) override;

 private:
  ParameterServerService(ShardContext* shard, Options options);

  void OnRoundComplete(const RoundKey& key, float lr,
                       absl::Span<const float> mean);
  void FillShardInfo(v1::ShardInfo* info) const;

  ShardContext& shard_;
  const v1::JobConfig& config_;
  const BlockLayout& layout_;
  PayloadCache payloads_;
  const uint64_t chunk_floats_;
  const Options options_;
  MemberRegistry& members_;
  ShardStore& store_;
  std::function<void(const RoundKey&, absl::Duration)> on_round_latency_;
  uint32_t bulk_port_ = 0;
  std::function<absl::Status(uint64_t, const std::string&, const CheckpointReload&)>
      on_roll_back_;
  const std::unique_ptr<ShardCheckpoint> checkpoint_;  // null: no full averages
  RoundTable rounds_;
  // Held through a roll back, so that the callers of one do not each start
  // it.
  absl::Mutex roll_back_mu_;

  TrafficCounter traffic_;
  // PushPull traffic by stream, indexed by the v1::Stream value.
  static constexpr int kStreams = 4;
  TrafficCounter stream_traffic_[kStreams];
  TrafficCounter other_traffic_;
  std::function<TrafficCounts()> other_services_traffic_;

  std::atomic<bool> shut_down_{false};
  std::atomic<bool> roll_back_failed_{false};
  // Last: destroyed (joined) first, while what it calls still exists.
  std::unique_ptr<ExpiryThread> expiry_;
};

}  // namespace cserps

#endif  // CSERPS_SERVER_PARAMETER_SERVER_SERVICE_H_
