#include "server/shard_context.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_dir.h"
#include "common/config.h"
#include "common/grpc_security.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "server/shard_checkpoint.h"
#include "spdlog/spdlog.h"

namespace cserps {
namespace {

uint64_t RandomIncarnation() {
  std::random_device random;
  return ((uint64_t{random()} << 32) ^ random()) | 1;  // never 0, which means none
}

}  // namespace

uint32_t MaxWaitingCallsPerRank(uint64_t shard_floats, uint64_t chunk_floats) {
  const uint64_t chunks = (shard_floats + chunk_floats - 1) / chunk_floats;
  return static_cast<uint32_t>(std::min<uint64_t>(8 * chunks + 64, 1u << 20));
}

uint32_t MaxModelWaiters(uint32_t num_workers, uint64_t shard_floats,
                         uint64_t chunk_floats) {
  return static_cast<uint32_t>(std::min<uint64_t>(
      uint64_t{num_workers} * MaxWaitingCallsPerRank(shard_floats, chunk_floats),
      1u << 20));
}

absl::StatusOr<std::unique_ptr<ShardContext>> ShardContext::Create(
    const v1::JobConfig& config, uint32_t shard) {
  ValidateOptions options;
  options.allow_port_zero = true;
  RETURN_IF_ERROR(ValidateJobConfig(config, options));
  const uint32_t num_shards = config.cluster().servers_size();
  if (shard >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", shard, " is out of range: cluster.servers lists ", num_shards,
        " servers"));
  }
  ASSIGN_OR_RETURN(ModelSpec spec, MakeModelSpec(config.model()));
  // Validation bounds the model by what a number can say (2^40 floats), not
  // by this machine's memory: a shard that cannot fit is refused by name
  // rather than aborted by its allocation (or, memory overcommitted, killed
  // while it fills it).
  const uint64_t shard_floats =
      BlockLayout(spec.num_params, config.algorithm().block_size(), num_shards).ShardSize(shard);
  const uint64_t memory_bytes =
      uint64_t{static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES))} * sysconf(_SC_PAGE_SIZE);
  auto no_room = [&] {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard ", shard, ": its ", shard_floats, " floats of model.num_params ", spec.num_params,
        " (", num_shards, " shards) do not fit in this machine's ", memory_bytes >> 20,
        " MiB: use more shards"));
  };
  if (shard_floats > memory_bytes / sizeof(float)) return no_room();
  std::unique_ptr<ShardContext> context;
  try {
    context.reset(new ShardContext(config, shard, spec.num_params));
  } catch (const std::bad_alloc&) {
    return no_room();
  }
  ASSIGN_OR_RETURN(context->security_, LoadTransportSecurity(config.security(), TlsRole::kServer));
  const v1::CheckpointConfig& checkpoint = config.checkpoint();
  if (checkpoint.resume() || checkpoint.restart_on_failure()) {
    absl::StatusOr<ResumedShard> resumed = ResumeShard(config, shard, &context->store_);
    if (resumed.ok()) {
      absl::MutexLock lock(&context->mu_);
      context->resumed_from_step_ = resumed->step;
      context->resumed_sections_ = std::move(resumed->sections);
    } else if (checkpoint.resume() || !absl::IsNotFound(resumed.status())) {
      return resumed.status();
    } else {
      ASSIGN_OR_RETURN(const bool earlier, HasManifestOf(checkpoint.dir(), context->fingerprint_));
      if (earlier) return resumed.status();
      spdlog::info("shard {}: no checkpoint of this job in {} yet: starting fresh", shard,
                   checkpoint.dir());
    }
  } else if (checkpoint.every_steps() > 0) {
    ASSIGN_OR_RETURN(const bool earlier, HasManifestOf(checkpoint.dir(), context->fingerprint_));
    if (earlier) {
      // Its steps would land among the earlier run's, and pruning would
      // keep that run's higher steps over its own.
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard, ": checkpoint.dir ", checkpoint.dir(),
          " already holds a checkpoint of this job (or one that cannot be read): resume it "
          "(--resume), or start this run in an empty folder"));
    }
  }
  if (checkpoint.every_steps() > 0) {
    RETURN_IF_ERROR(ForgetPartsAfter(CheckpointJob::Of(config), CheckpointRole::kShard, shard,
                                     context->resumed_from_step()));
  }
  return context;
}

absl::Status ShardContext::Authenticate(const grpc::ServerContextBase& context) {
  absl::Status status = CheckCallToken(context, security_.token);
  if (!status.ok()) unauthenticated_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::Status ShardContext::AuthenticateHello(std::optional<absl::string_view> token) {
  absl::Status status = CheckToken(security_.token, token, "the bulk hello", "token_bytes");
  if (!status.ok()) unauthenticated_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

const absl::Status& ShardContext::Refusal(const absl::Status& refusal) {
  switch (refusal.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      bad_input_.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      break;
  }
  return refusal;
}

const CheckpointSection* ShardContext::ResumedSection(absl::string_view name) const {
  for (const CheckpointSection& s : resumed_sections_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

ShardContext::ShardContext(const v1::JobConfig& config, uint32_t shard,
                           uint64_t num_params)
    : config_(config),
      shard_(shard),
      fingerprint_(JobFingerprint(config)),
      layout_(num_params, config.algorithm().block_size(),
              config.cluster().servers_size()),
      chunk_floats_(ChunkFloats(config.cluster())),
      members_(config.cluster().num_workers()),
      activity_(config.cluster().num_workers(),
                absl::Seconds(config.cluster().round_timeout_s()),
                MaxWaitingCallsPerRank(layout_.ShardSize(shard), chunk_floats_)),
      store_(layout_.ShardFirstFloat(shard), layout_.ShardSize(shard),
             MaxModelWaiters(config.cluster().num_workers(), layout_.ShardSize(shard),
                             chunk_floats_)),
      incarnation_(RandomIncarnation()),
      acknowledged_(config.cluster().num_workers(), 0) {}

uint64_t ShardContext::resumed_from_step() const {
  absl::MutexLock lock(&mu_);
  return resumed_from_step_;
}

void ShardContext::RecordRollBack(uint64_t restarted, uint64_t step) {
  absl::MutexLock lock(&mu_);
  ++roll_backs_;
  rolled_back_for_ = restarted;
  resumed_from_step_ = step;
}

void ShardContext::Acknowledge(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  if (rank < acknowledged_.size()) acknowledged_[rank] = roll_backs_;
}

uint64_t ShardContext::rolled_back_for() const {
  absl::MutexLock lock(&mu_);
  return rolled_back_for_;
}

absl::Status ShardContext::CheckFingerprint(uint64_t fingerprint) const {
  if (fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config fingerprint ", fingerprint, " does not match the job's ",
        fingerprint_, " on shard ", shard_,
        ": this worker runs a different job config; Register shows the "
        "differing field"));
  }
  return absl::OkStatus();
}

absl::Status ShardContext::CheckMember(uint32_t rank) const {
  if (rank >= members_.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is out of range: the job has ", members_.world_size(),
        " workers"));
  }
  if (!members_.IsRegistered(rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " has not registered with shard ", shard_,
        ": call Register first"));
  }
  return absl::OkStatus();
}

absl::Status ShardContext::Admit(uint64_t fingerprint, uint32_t rank, absl::Time now) {
  RETURN_IF_ERROR(CheckFingerprint(fingerprint));
  RETURN_IF_ERROR(CheckMember(rank));
  RETURN_IF_ERROR(CheckAcknowledged(rank));
  activity_.Heard(rank, now);
  return absl::OkStatus();
}

absl::Status ShardContext::CheckAcknowledged(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  if (acknowledged_[rank] == roll_backs_) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      "shard ", shard_, " rolled back to the checkpoint of step ", resumed_from_step_,
      ", which a restarted shard resumed from: roll back to it too (RollBack)"));
}

}  // namespace cserps
