// What every gRPC service of one server shard shares: the job config, the
// block layout, the registered members and when they were last heard from,
// and the shard's part of the model.
// Built once by PsServer; outlives the services.
#ifndef CSERPS_SERVER_SHARD_CONTEXT_H_
#define CSERPS_SERVER_SHARD_CONTEXT_H_

#include <grpcpp/server_context.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/block_layout.h"
#include "common/checkpoint_file.h"
#include "common/transport_security.h"
#include "cserps/v1/config.pb.h"
#include "server/member_activity.h"
#include "server/member_registry.h"
#include "server/shard_store.h"

namespace cserps {

// The calls one rank may keep waiting on a shard of `shard_floats` floats
// at once (MemberActivity): 8 per chunk of the whole shard (a round's
// chunks travel at once; a member has at most a few rounds of the streams in
// flight) and 64 more.
uint32_t MaxWaitingCallsPerRank(uint64_t shard_floats, uint64_t chunk_floats);
// The PullModel calls that may wait for a shard's model at once: a
// PullModel names no rank, so as many as all ranks may keep waiting.
uint32_t MaxModelWaiters(uint32_t num_workers, uint64_t shard_floats,
                         uint64_t chunk_floats);

class ShardContext {
 public:
  // Validates `config` (defaults applied; port 0 allowed) and `shard`, and
  // loads the files of config.security (LoadTransportSecurity's errors);
  // with checkpoint.resume, loads the shard's model from the newest complete
  // checkpoint (ResumeShard's errors). A fresh run that writes checkpoints
  // into a folder holding this job's is refused (FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<ShardContext>> Create(
      const v1::JobConfig& config, uint32_t shard);

  const v1::JobConfig& config() const { return config_; }
  uint32_t shard() const { return shard_; }
  uint64_t fingerprint() const { return fingerprint_; }
  const BlockLayout& layout() const { return layout_; }
  // Floats per chunk of a payload (cluster.max_message_bytes).
  uint64_t chunk_floats() const { return chunk_floats_; }
  MemberRegistry& members() { return members_; }
  const MemberRegistry& members() const { return members_; }
  // Silence timeout cluster.round_timeout_s.
  MemberActivity& activity() { return activity_; }
  const MemberActivity& activity() const { return activity_; }
  ShardStore& store() { return store_; }
  const ShardStore& store() const { return store_; }
  // The step of the checkpoint the shard resumed from, or last rolled back
  // to; 0: a fresh start. Its rounds' step window starts there.
  uint64_t resumed_from_step() const;
  // Random and not 0, chosen at Create: another value at the shard's
  // address is another process.
  uint64_t incarnation() const { return incarnation_; }

  // In-place roll back (docs/protocol.md 7.12): the shard has gone back to
  // the checkpoint of `step`, which the shard of incarnation `restarted`
  // restarted from. Until a rank acknowledges it (Acknowledge; Register
  // does), Admit refuses its requests with ABORTED.
  void RecordRollBack(uint64_t restarted, uint64_t step);
  void Acknowledge(uint32_t rank);
  // The `restarted` of the newest RecordRollBack; 0: none.
  uint64_t rolled_back_for() const;
  // A section other than the model of the checkpoint it resumed from (a
  // service's state); null when there is none of that name.
  const CheckpointSection* ResumedSection(absl::string_view name) const;

  // TLS files and token of config.security, loaded by Create.
  const TransportSecurity& security() const { return security_; }
  // UNAUTHENTICATED, counted, when the job has a token and the call does not
  // carry it (CheckCallToken). Every handler asks before anything else.
  absl::Status Authenticate(const grpc::ServerContextBase& context);
  // The same for a bulk hello's token (none: the hello carried none).
  absl::Status AuthenticateHello(std::optional<absl::string_view> token);
  // Calls Authenticate refused.
  uint64_t unauthenticated() const { return unauthenticated_.load(std::memory_order_relaxed); }
  // `refusal`, counted as bad input when its code says the request itself
  // was wrong (INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION,
  // ALREADY_EXISTS); a handler passes every refusal through it.
  const absl::Status& Refusal(const absl::Status& refusal);
  uint64_t bad_input() const { return bad_input_.load(std::memory_order_relaxed); }
  // Client certificates the TLS handshake refused (MakeServerCredentials
  // counts them here).
  std::atomic<uint64_t>* bad_certificate_counter() { return &bad_certificates_; }
  uint64_t bad_certificates() const { return bad_certificates_.load(std::memory_order_relaxed); }

  // FAILED_PRECONDITION when a request's fingerprint is not the job's.
  absl::Status CheckFingerprint(uint64_t fingerprint) const;
  // INVALID_ARGUMENT for a rank out of range, FAILED_PRECONDITION for one
  // that has not registered with this shard.
  absl::Status CheckMember(uint32_t rank) const;
  // For a request from a member: CheckFingerprint, then CheckMember, then
  // CheckAcknowledged; when all pass, `rank` has been heard from at `now`
  // (MemberActivity::Heard).
  absl::Status Admit(uint64_t fingerprint, uint32_t rank, absl::Time now);
  // ABORTED for a rank (< num_workers) that has not acknowledged the newest
  // roll back. Takes only this context's lock.
  absl::Status CheckAcknowledged(uint32_t rank) const;

 private:
  ShardContext(const v1::JobConfig& config, uint32_t shard, uint64_t num_params);

  const v1::JobConfig config_;
  const uint32_t shard_;
  const uint64_t fingerprint_;
  const BlockLayout layout_;
  const uint64_t chunk_floats_;
  MemberRegistry members_;
  MemberActivity activity_;
  ShardStore store_;
  const uint64_t incarnation_;
  std::vector<CheckpointSection> resumed_sections_;  // set by Create
  TransportSecurity security_;                       // set by Create
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> bad_input_{0};
  std::atomic<uint64_t> bad_certificates_{0};
  mutable absl::Mutex mu_;
  uint64_t resumed_from_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t roll_backs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rolled_back_for_ ABSL_GUARDED_BY(mu_) = 0;
  // By rank: roll_backs_ when it last acknowledged.
  std::vector<uint64_t> acknowledged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SHARD_CONTEXT_H_
