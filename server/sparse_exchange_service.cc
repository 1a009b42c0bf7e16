#include "server/sparse_exchange_service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/block_layout.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "server/unary_reply.h"

namespace cserps {
namespace {

// topk-ssgd returns the sum on the union of the members' entries,
// gtopk-ssgd its global top-k.
SparseSelection SelectionOf(const v1::AlgorithmConfig& algorithm) {
  const absl::StatusOr<AlgorithmInfo> info = FindAlgorithm(algorithm.name());
  return info.ok() && info->id == AlgorithmId::kTopkSsgd ? SparseSelection::kUnion
                                                          : SparseSelection::kGlobalTopK;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SparseExchangeService>> SparseExchangeService::Create(
    ShardContext* shard, Options options) {
  if (!options.now) options.now = RealNow;
  const v1::JobConfig& config = shard->config();
  const bool sparse_job = IsSparseTopk(config.algorithm().name());
  uint64_t k_s = 0;
  if (sparse_job) {
    const uint64_t d = shard->layout().num_params();
    if (d > (uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "algorithm.name: ", config.algorithm().name(), " sends uint32 indices, "
          "but the model has ", d, " floats (at most 2^32)"));
    }
    k_s = ShardSparseK(SparseK(config.algorithm(), d),
                       shard->layout().ShardSize(shard->shard()), d);
    // An entry is 8 bytes; the same 1024-byte allowance as chunks.
    const uint64_t max_entries = shard->chunk_floats() / 2;
    const bool is_union = SelectionOf(config.algorithm()) == SparseSelection::kUnion;
    // A union's indices are distinct floats of the shard.
    const uint64_t reply_entries =
        is_union ? std::min(k_s * config.cluster().num_workers(),
                            shard->layout().ShardSize(shard->shard()))
                 : k_s;
    if (reply_entries > max_entries) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster.max_message_bytes: ", config.cluster().max_message_bytes(),
          " bytes hold at most ", max_entries, " sparse entries, but shard ",
          shard->shard(), " with algorithm.density ", config.algorithm().density(),
          " has k_s = ", k_s, is_union ? " and topk-ssgd replies with up to "
                                       : "",
          is_union ? absl::StrCat(reply_entries, " (k_s times num_workers, at most the shard's "
                                                 "floats)")
                   : "",
          "; raise max_message_bytes or lower the density"));
    }
  }
  if (sparse_job && shard->resumed_from_step() > 0 &&
      UsesMomentum(config.optimizer().momentum_kind())) {
    const CheckpointSection* resumed = shard->ResumedSection(kMomentumSection);
    if (resumed == nullptr || resumed->values.size() != shard->store().size()) {
      return absl::DataLossError(absl::StrCat(
          "the checkpoint of step ", shard->resumed_from_step(), " of shard ", shard->shard(),
          resumed == nullptr ? " has no section '" : " has a section '", kMomentumSection,
          resumed == nullptr ? "'" : absl::StrCat("' of ", resumed->values.size(), " floats, not ",
                                                  shard->store().size()),
          ": the shard cannot resume the servers' momentum of ", config.algorithm().name()));
    }
  }
  return std::unique_ptr<SparseExchangeService>(
      new SparseExchangeService(shard, std::move(options), sparse_job, k_s));
}

absl::Status SparseExchangeService::RollBack(uint64_t step, const std::string& reason,
                                             const CheckpointReload& reload) {
  return rounds_.Restart(step, reason, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<CheckpointSection> sections, reload());
    if (!checkpoints_momentum()) return absl::OkStatus();
    absl::MutexLock lock(&apply_mu_);
    for (const CheckpointSection& section : sections) {
      if (section.name != kMomentumSection || section.values.size() != momentum_.size()) continue;
      momentum_ = section.values;
      return absl::OkStatus();
    }
    return absl::DataLossError(absl::StrCat("the checkpoint of step ", step, " of shard ",
                                            shard_.shard(), " holds no servers' momentum of ",
                                            momentum_.size(), " floats"));
  });
}

std::vector<float> SparseExchangeService::MomentumForCheckpoint() {
  absl::MutexLock lock(&apply_mu_);
  return momentum_;
}

SparseExchangeService::SparseExchangeService(ShardContext* shard, Options options,
                                             bool sparse_job, uint64_t k_s)
    : shard_(*shard),
      options_(std::move(options)),
      sparse_job_(sparse_job),
      selection_(SelectionOf(shard->config().algorithm())),
      k_s_(k_s),
      rule_(MakeDirectionRule(shard->config().optimizer())),
      rounds_(SparseRoundTable::Options{
          .limits =
              {
                  .world_size = shard->config().cluster().num_workers(),
                  .max_step_lag = shard->config().cluster().max_step_lag(),
                  .retained_rounds = shard->config().cluster().retained_rounds(),
                  .timeout = absl::Seconds(shard->config().cluster().round_timeout_s()),
                  .first_step = shard->resumed_from_step(),
                  .admitted = [shard](uint32_t rank) { return shard->CheckAcknowledged(rank); },
              },
          .complete =
              [this](uint64_t, std::vector<SparseVector> pushes) {
                return CompleteRound(std::move(pushes));
              },
          .on_latency =
              [this](absl::Duration latency) {
                if (on_round_latency_) on_round_latency_(latency);
              },
      }) {
  if (checkpoints_momentum()) {
    absl::MutexLock lock(&apply_mu_);
    const CheckpointSection* resumed = shard->ResumedSection(kMomentumSection);
    if (resumed != nullptr) {
      momentum_ = resumed->values;  // Create checked its size
    } else {
      momentum_.assign(shard->store().size(), 0.0f);
    }
    update_.assign(shard->store().size(), 0.0f);
  }
  if (sparse_job_ && options_.expiry_thread) {
    expiry_ = StartRoundExpiry(options_.now, &rounds_);
  }
}

SparseExchangeService::~SparseExchangeService() { Shutdown(); }

void SparseExchangeService::Shutdown() {
  if (shut_down_.exchange(true)) return;
  rounds_.FailAll(absl::StrCat("server shard ", shard_.shard(), " is shutting down"));
}

SparseReply SparseExchangeService::CompleteRound(std::vector<SparseVector> pushes) {
  const SparseVector selected = AggregateSparse(pushes, selection_, k_s_);
  // Algorithm 1, line 6, with the float expressions the workers use, so that
  // both hold the same bits.
  const float members = static_cast<float>(pushes.size());
  ShardStore& store = shard_.store();
  // Indices were checked against the shard's range, so the store's updates
  // do not fail.
  if (!UsesMomentum(rule_.kind)) {
    std::vector<float> deltas(selected.values.size());
    for (size_t e = 0; e < deltas.size(); ++e) deltas[e] = selected.values[e] / members;
    CSERPS_CHECK(store.SubtractAt(selected.indices, deltas).ok());
    return EncodeSparse(selected);
  }
  // Momentum makes every float move: m = βm + u; heavy ball x -= m,
  // Nesterov x -= u + βm, with u = sum / P on G and 0 elsewhere.
  const uint64_t first = store.first_float();
  absl::MutexLock lock(&apply_mu_);
  for (size_t e = 0; e < selected.indices.size(); ++e) {
    update_[selected.indices[e] - first] = selected.values[e] / members;
  }
  // The lambda runs within this hold of apply_mu_, which the analysis
  // cannot see into: it gets the buffers.
  const float* const u = update_.data();
  float* const m = momentum_.data();
  store.Update(
      [&](absl::Span<float> x) { ApplySharedMomentum(rule_, x.size(), u, m, x.data()); });
  for (uint32_t index : selected.indices) update_[index - first] = 0.0f;
  return EncodeSparse(selected);
}

std::string SparseExchangeService::CallName(const PushHead& head) const {
  return absl::StrCat("SparsePushPull (step ", head.step, ") from rank ", head.rank,
                      " to shard ", shard_.shard());
}

absl::Status SparseExchangeService::Admit(const PushHead& head, absl::Time arrived) {
  RETURN_IF_ERROR(shard_.Admit(head.fingerprint, head.rank, arrived));
  if (!sparse_job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "algorithm ", shard_.config().algorithm().name(),
        " does not use the sparse exchange (only gtopk-ssgd and topk-ssgd do)"));
  }
  if (k_s_ == 0) {
    return absl::FailedPreconditionError("this shard owns no floats; workers send it nothing");
  }
  if (head.k != k_s_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k ", head.k, " is not this shard's k_s ", k_s_,
        " (docs/protocol.md 14.2: round(k * shard size / d))"));
  }
  return absl::OkStatus();
}

void SparseExchangeService::JoinRound(const PushHead& head, SparseVector entries,
                                      absl::Time arrived, uint64_t request_bytes,
                                      std::string name, SparseRoundCallback done) {
  const uint32_t rank = head.rank;
  if (absl::Status room = shard_.activity().CallStarted(rank, arrived); !room.ok()) {
    traffic_.refused.AddRequest(request_bytes);
    done(shard_.Refusal(Prefixed(name, room)));
    return;
  }
  // As ParameterServerService::JoinRound: only refusals carry the codes
  // Refusal counts.
  rounds_.Push(
      head.step, rank, std::move(entries), arrived,
      [this, rank, name = std::move(name),
       done = std::move(done)](absl::StatusOr<SparseRoundReply> reply) {
        shard_.activity().CallEnded(rank, options_.now());
        if (!reply.ok()) {
          done(shard_.Refusal(Prefixed(name, reply.status())));
          return;
        }
        done(*std::move(reply));
      },
      [&](bool joined) {
        (joined ? traffic_.handled : traffic_.refused).AddRequest(request_bytes);
      });
}

void SparseExchangeService::Push(const PushHead& head, SparseVector entries,
                                 uint64_t request_bytes, uint64_t reply_overhead,
                                 SparseRoundCallback done) {
  std::string name = CallName(head);
  const absl::Time arrived = options_.now();
  absl::Status ok = Admit(head, arrived);
  if (ok.ok()) {
    const BlockLayout& layout = shard_.layout();
    ok = CheckSparseEntries(entries, k_s_, layout.ShardFirstFloat(shard_.shard()),
                            layout.ShardEndFloat(shard_.shard()));
  }
  if (!ok.ok()) {
    traffic_.refused.AddRequest(request_bytes);
    done(shard_.Refusal(Prefixed(name, ok)));
    return;
  }
  JoinRound(head, std::move(entries), arrived, request_bytes, std::move(name),
            [this, reply_overhead, done = std::move(done)](absl::StatusOr<SparseRoundReply> reply) {
              if (reply.ok()) {
                traffic_.handled.AddReply(reply_overhead + (*reply)->indices.size() +
                                          (*reply)->values.size());
              }
              done(std::move(reply));
            });
}

grpc::ServerUnaryReactor* SparseExchangeService::SparsePushPull(
    grpc::CallbackServerContext* context, const v1::SparsePushPullRequest* request,
    v1::SparsePushPullResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("SparsePushPull", caller));
  }
  const PushHead head{request->fingerprint(), request->rank(), request->step(), request->k()};
  std::string name = CallName(head);
  const uint64_t request_bytes = request->ByteSizeLong();
  const absl::Time arrived = options_.now();
  absl::Status ok = Admit(head, arrived);
  absl::StatusOr<SparseVector> entries = absl::UnknownError("unparsed");
  if (ok.ok()) {
    const BlockLayout& layout = shard_.layout();
    entries = ParseSparsePush(request->indices(), request->values(), k_s_,
                              layout.ShardFirstFloat(shard_.shard()),
                              layout.ShardEndFloat(shard_.shard()));
    ok = entries.status();
  }
  if (!ok.ok()) {
    traffic_.refused.AddRequest(request_bytes);
    return FinishWith(context, shard_.Refusal(Prefixed(name, ok)));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  response->set_step(request->step());
  JoinRound(head, *std::move(entries), arrived, request_bytes, std::move(name),
            [this, reactor, response](absl::StatusOr<SparseRoundReply> reply) {
              if (!reply.ok()) {
                reactor->Finish(ToGrpcStatus(reply.status()));
                return;
              }
              response->set_indices((*reply)->indices);
              response->set_values((*reply)->values);
              traffic_.handled.AddReply(response->ByteSizeLong());
              reactor->Finish(grpc::Status::OK);
            });
  return reactor;
}

SparseExchangeService::Counters SparseExchangeService::counters() const {
  Counters c;
  c.rounds_completed = rounds_.rounds_completed();
  c.rounds_failed = rounds_.rounds_failed();
  c.open_rounds = rounds_.open_rounds();
  c.newest_step = rounds_.newest_step();
  c.traffic = traffic_.handled.Snapshot();
  c.refused = traffic_.refused.Snapshot();
  return c;
}

}  // namespace cserps
