#include "server/parameter_server_service.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/algorithm_catalog.h"
#include "common/checkpoint_dir.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "server/step_window.h"
#include "server/unary_reply.h"
#include "spdlog/spdlog.h"

namespace cserps {

absl::StatusOr<std::unique_ptr<ParameterServerService>>
ParameterServerService::Create(ShardContext* shard, Options options) {
  if (!options.now) options.now = RealNow;
  return std::unique_ptr<ParameterServerService>(
      new ParameterServerService(shard, std::move(options)));
}

ParameterServerService::ParameterServerService(ShardContext* shard, Options options)
    : shard_(*shard),
      config_(shard->config()),
      layout_(shard->layout()),
      payloads_(config_.seed(), layout_, shard->shard()),
      chunk_floats_(shard->chunk_floats()),
      options_(std::move(options)),
      members_(shard->members()),
      store_(shard->store()),
      checkpoint_((config_.checkpoint().every_steps() > 0 &&
                    !config_.checkpoint().dir().empty()) ||
                           config_.cluster().admit_every_steps() > 0
                       ? std::make_unique<ShardCheckpoint>(config_, shard->shard(), &store_)
                       : nullptr),
      rounds_(RoundTable::Options{
          .limits =
              {
                  .world_size = config_.cluster().num_workers(),
                  .max_step_lag = PushPullStepWindow(config_, layout_, shard->shard()),
                  .retained_rounds = config_.cluster().retained_rounds(),
                  .timeout = absl::Seconds(config_.cluster().round_timeout_s()),
                  .first_step = shard->resumed_from_step(),
                  .elastic = config_.cluster().elastic(),
                  .admitted = [shard](uint32_t rank) { return shard->CheckAcknowledged(rank); },
              },
          .on_complete =
              [this](const RoundKey& key, float lr,
                     absl::Span<const float> mean) {
                OnRoundComplete(key, lr, mean);
              },
          .on_latency =
              [this](const RoundKey& key, absl::Duration latency) {
                if (on_round_latency_) on_round_latency_(key, latency);
              },
      }) {
  rounds_.SetDropObserver([this](const std::vector<uint32_t>& ranks, const std::string& round) {
    spdlog::warn("shard {}: {} timed out; dropped rank(s) {} from the job, {} members go on",
                 shard_.shard(), round, absl::StrJoin(ranks, ", "), rounds_.members());
  });
  if (options_.expiry_thread) expiry_ = StartRoundExpiry(options_.now, &rounds_);
}

ParameterServerService::~ParameterServerService() { Shutdown(); }

void ParameterServerService::Shutdown() {
  if (shut_down_.exchange(true)) return;
  const absl::Status reason = absl::UnavailableError(
      absl::StrCat("server shard ", shard_.shard(), " is shutting down"));
  rounds_.FailAll(std::string(reason.message()));
  store_.FailWaiters(reason);
}

void ParameterServerService::FillShardInfo(v1::ShardInfo* info) const {
  info->set_shard(shard_.shard());
  info->set_num_shards(layout_.num_shards());
  info->set_first_block(layout_.ShardFirstBlock(shard_.shard()));
  info->set_end_block(layout_.ShardEndBlock(shard_.shard()));
  info->set_first_float(layout_.ShardFirstFloat(shard_.shard()));
  info->set_end_float(layout_.ShardEndFloat(shard_.shard()));
}

grpc::ServerUnaryReactor* ParameterServerService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("Register", caller));
  }
  v1::JobConfig theirs = request->config();
  ApplyDefaults(&theirs);
  absl::Status same = CompareJobConfigs(config_, theirs, "server", "worker");
  if (!same.ok()) return FinishWith(context, shard_.Refusal(same));
  const std::vector<uint32_t> times_dropped = rounds_.times_dropped();
  absl::StatusOr<uint32_t> rank =
      members_.Register(request->requested_rank(), request->worker_id(),
                        config_.cluster().elastic() ? &times_dropped : nullptr);
  if (!rank.ok()) return FinishWith(context, shard_.Refusal(rank.status()));
  shard_.activity().Heard(*rank, options_.now());
  response->set_rank(*rank);
  response->set_world_size(members_.world_size());
  response->set_job_seed(config_.seed());
  response->set_fingerprint(shard_.fingerprint());
  response->set_model_size(layout_.num_params());
  response->set_block_size(layout_.block_size());
  FillShardInfo(response->mutable_shard());
  response->set_bulk_port(bulk_port_);
  response->set_resumed_from_step(shard_.resumed_from_step());
  response->set_incarnation(shard_.incarnation());
  shard_.Acknowledge(*rank);
  return FinishWith(context, absl::OkStatus());
}

void ParameterServerService::OnRoundComplete(const RoundKey& key, float lr,
                                             absl::Span<const float> mean) {
  store_.ApplyMean(key.stream != v1::GRAD, *payloads_.Get(key.stream, key.step, key.ratio),
                   key.chunk * chunk_floats_, mean, lr);
  if (key.stream == v1::CHECKPOINT) checkpoint_->ChunkApplied(key.step, mean.size());
}

std::string ParameterServerService::CallName(const PushPullHead& head) {
  return absl::StrCat("PushPull (step ", head.step, ", stream ", StreamName(head.stream),
                      ", chunk ", head.chunk, ") from rank ", head.rank);
}

absl::StatusOr<size_t> ParameterServerService::AdmitPushPull(const PushPullHead& head,
                                                             absl::Time arrived) {
  auto refuse = [&](const absl::Status& status) {
    return Prefixed(CallName(head), status);
  };
  absl::Status ok = shard_.Admit(head.fingerprint, head.rank, arrived);
  if (!ok.ok()) return refuse(ok);
  if (head.stream != v1::GRAD && head.stream != v1::MODEL && head.stream != v1::CHECKPOINT) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("unknown stream ", head.stream, " (known: GRAD, MODEL, CHECKPOINT)")));
  }
  if (!std::isfinite(head.lr) || head.lr < 0) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("lr ", head.lr, " must be finite and >= 0")));
  }
  if (head.ratio < 1) {
    return refuse(absl::InvalidArgumentError("ratio must be >= 1 (1 selects every block)"));
  }
  if (head.stream == v1::CHECKPOINT) {
    if (head.ratio != 1) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          "a CHECKPOINT round averages every block: ratio must be 1 (got ", head.ratio, ")")));
    }
    if (checkpoint_ == nullptr) {
      return refuse(absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard_.shard(), " takes no full averages: its checkpoint.dir is empty "
          "(give every server and worker the same folder) and cluster.admit_every_steps 0")));
    }
  } else {
    ok = CheckRoundRatio(config_.algorithm(), head.stream, head.ratio);
    if (!ok.ok()) return refuse(ok);
  }
  const std::shared_ptr<const ShardPayload> payload =
      payloads_.Get(head.stream, head.step, head.ratio);
  const uint32_t num_chunks = NumChunks(payload->size(), chunk_floats_);
  if (head.chunk >= num_chunks) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "chunk ", head.chunk, " is out of range: this round has ", num_chunks, " chunks")));
  }
  const uint64_t begin = uint64_t{head.chunk} * chunk_floats_;
  return static_cast<size_t>(std::min(chunk_floats_, payload->size() - begin));
}

void ParameterServerService::JoinRound(const PushPullHead& head,
                                       absl::Span<const float> values,
                                       uint64_t request_bytes, absl::Time arrived,
                                       RoundCallback done, std::shared_ptr<const void> keep) {
  const RoundKey key{head.step, head.stream, head.chunk, head.ratio};
  if (absl::Status room = shard_.activity().CallStarted(head.rank, arrived); !room.ok()) {
    CountRefused(request_bytes);
    done(Prefixed(CallName(head), room));
    return;
  }
  // Refusal counts the codes of refused pushes only: a round that fails
  // after a push joined it answers DEADLINE_EXCEEDED, ABORTED or UNAVAILABLE.
  rounds_.Push(
      key, head.rank, head.weight, head.lr, values, arrived,
      [this, head, done = std::move(done)](absl::StatusOr<RoundMean> mean) {
        shard_.activity().CallEnded(head.rank, options_.now());
        if (!mean.ok()) {
          done(shard_.Refusal(Prefixed(CallName(head), mean.status())));
        } else {
          done(std::move(mean));
        }
      },
      std::move(keep), [&](bool joined) {
        if (joined) {
          stream_traffic_[head.stream].AddRequest(request_bytes, values.size());
        } else {
          CountRefused(request_bytes);
        }
      });
}

void ParameterServerService::CountReply(int stream, uint64_t bytes) {
  traffic_.AddReply(bytes);
  stream_traffic_[stream].AddReply(bytes);
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(
    grpc::CallbackServerContext* context, const v1::PushPullRequest* request,
    v1::PushPullResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("PushPull", caller));
  }
  const uint64_t request_bytes = request->ByteSizeLong();
  CountRequest(request_bytes);
  const PushPullHead head{request->fingerprint(), request->rank(),  request->step(),
                          request->stream(),      request->ratio(), request->chunk(),
                          request->weight(),      request->lr()};
  auto refuse = [&](const absl::Status& status) {
    CountRefused(request_bytes);
    return FinishWith(context, shard_.Refusal(status));
  };
  const absl::Time arrived = options_.now();
  absl::StatusOr<size_t> count = AdmitPushPull(head, arrived);
  if (!count.ok()) return refuse(count.status());
  // The round reads the values only while Push runs, so the request's own
  // bytes serve when they are float-aligned; a copy only when they are not.
  const std::string& bytes = request->values();
  std::vector<float> copy;
  absl::Span<const float> values;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0 &&
      bytes.size() == *count * sizeof(float)) {
    values = absl::MakeConstSpan(reinterpret_cast<const float*>(bytes.data()), *count);
  } else {
    copy.resize(*count);
    absl::Status ok = BytesToFloats(bytes, absl::MakeSpan(copy), "values");
    if (!ok.ok()) return refuse(Prefixed(CallName(head), ok));
    values = copy;
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  response->set_step(head.step);
  response->set_stream(request->stream());
  response->set_chunk(head.chunk);
  JoinRound(head, values, request_bytes, arrived,
            [this, reactor, response, stream = head.stream](absl::StatusOr<RoundMean> mean) {
              if (!mean.ok()) {
                reactor->Finish(ToGrpcStatus(mean.status()));
                return;
              }
              response->set_mean(FloatsToBytes(**mean));
              response->set_members(members());
              CountReply(stream, response->ByteSizeLong());
              reactor->Finish(grpc::Status::OK);
            });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PullModel(
    grpc::CallbackServerContext* context, const v1::PullModelRequest* request,
    v1::PullModelResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("PullModel", caller));
  }
  absl::Status ok = shard_.CheckFingerprint(request->fingerprint());
  if (ok.ok() && request->count() > chunk_floats_) {
    ok = absl::InvalidArgumentError(absl::StrCat(
        "PullModel of ", request->count(), " floats exceeds the chunk limit of ",
        chunk_floats_, " (cluster.max_message_bytes)"));
  }
  if (!ok.ok()) return FinishWith(context, shard_.Refusal(ok));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const uint64_t offset = request->offset();
  const uint64_t count = request->count();
  auto answer = [this, reactor, response, offset, count](absl::Status status) {
    if (status.ok()) {
      response->set_offset(offset);
      status = store_.Read(offset, count, response->mutable_values());
    }
    if (status.ok()) {
      traffic_.AddReply(response->ByteSizeLong());
      other_traffic_.AddReply(response->ByteSizeLong());
    }
    reactor->Finish(ToGrpcStatus(status));
  };
  if (request->wait_for_init()) {
    store_.WhenInitialised(std::move(answer), [context] { return context->IsCancelled(); });
  } else if (!store_.initialised()) {
    answer(absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_.shard(), " has no model yet: rank 0 initialises it with PushModel")));
  } else {
    answer(absl::OkStatus());
  }
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PushModel(
    grpc::CallbackServerContext* context, const v1::PushModelRequest* request,
    v1::PushModelResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("PushModel", caller));
  }
  traffic_.AddRequest(request->ByteSizeLong());
  other_traffic_.AddRequest(request->ByteSizeLong());
  absl::Status ok = shard_.Admit(request->fingerprint(), request->rank(), options_.now());
  if (ok.ok()) ok = CheckFloatBytes(request->values(), "PushModel values");
  if (!ok.ok()) return FinishWith(context, shard_.Refusal(ok));
  std::vector<float> values(request->values().size() / sizeof(float));
  ok = BytesToFloats(request->values(), absl::MakeSpan(values), "values");
  if (!ok.ok()) return FinishWith(context, shard_.Refusal(ok));
  absl::StatusOr<bool> initialised = store_.Write(request->offset(), values);
  if (!initialised.ok()) {
    return FinishWith(context, shard_.Refusal(absl::Status(
                                   initialised.status().code(),
                                   absl::StrCat("PushModel: ", initialised.status().message()))));
  }
  response->set_shard_initialised(*initialised);
  return FinishWith(context, absl::OkStatus());
}

ParameterServerService::Counters ParameterServerService::counters() const {
  Counters c;
  c.registered = members_.registered();
  c.rounds_completed = rounds_.rounds_completed();
  c.rounds_failed = rounds_.rounds_failed();
  c.grad_rounds_completed = rounds_.rounds_completed(v1::GRAD);
  c.grad_rounds_failed = rounds_.rounds_failed(v1::GRAD);
  c.model_rounds_completed = rounds_.rounds_completed(v1::MODEL);
  c.model_rounds_failed = rounds_.rounds_failed(v1::MODEL);
  c.checkpoint_rounds_completed = rounds_.rounds_completed(v1::CHECKPOINT);
  c.checkpoint_rounds_failed = rounds_.rounds_failed(v1::CHECKPOINT);
  c.checkpoints_written = checkpoint_ != nullptr ? checkpoint_->written() : 0;
  c.open_rounds = rounds_.open_rounds();
  c.newest_step = rounds_.newest_step();
  // Streams before totals: a request adds to its total before its stream,
  // so the totals read here normally cover the stream bytes read here.
  c.grad = stream_traffic_[v1::GRAD].Snapshot();
  c.model = stream_traffic_[v1::MODEL].Snapshot();
  c.checkpoint = stream_traffic_[v1::CHECKPOINT].Snapshot();
  c.dropped = rounds_.dropped_ranks().size();
  c.admitted = rounds_.admitted_ranks().size();
  c.traffic = traffic_.Snapshot();
  c.other = other_traffic_.Snapshot();
  return c;
}

grpc::ServerUnaryReactor* ParameterServerService::GetStatus(
    grpc::CallbackServerContext* context, const v1::GetStatusRequest* /*request*/,
    v1::GetStatusResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("GetStatus", caller));
  }
  FillShardInfo(response->mutable_shard());
  response->set_fingerprint(shard_.fingerprint());
  response->set_world_size(members_.world_size());
  response->set_registered(members_.registered());
  response->set_model_initialised(store_.initialised());
  response->set_rounds_completed(rounds_.rounds_completed());
  response->set_rounds_failed(rounds_.rounds_failed());
  response->set_open_rounds(rounds_.open_rounds());
  response->set_newest_step(rounds_.newest_step());
  for (uint32_t r : rounds_.dropped_ranks()) response->add_dropped_ranks(r);
  for (uint32_t r : rounds_.admitted_ranks()) response->add_admitted_ranks(r);
  response->set_members(rounds_.members());
  if (checkpoint_ != nullptr) {
    response->set_newest_full_average_step(checkpoint_->newest_full_average_step());
  }
  response->set_incarnation(shard_.incarnation());
  response->set_resumed_from_step(shard_.resumed_from_step());
  response->set_rolled_back_for(shard_.rolled_back_for());
  TrafficCounts total = traffic_.Snapshot();
  if (other_services_traffic_) {
    const TrafficCounts other = other_services_traffic_();
    total.request_bytes += other.request_bytes;
    total.reply_bytes += other.reply_bytes;
  }
  response->set_bytes_in(total.request_bytes);
  response->set_bytes_out(total.reply_bytes);
  for (int s : {v1::GRAD, v1::MODEL, v1::CHECKPOINT}) {
    const TrafficCounts counts = stream_traffic_[s].Snapshot();
    v1::StreamTraffic* traffic = response->add_streams();
    traffic->set_stream(static_cast<v1::Stream>(s));
    traffic->set_bytes_in(counts.request_bytes);
    traffic->set_bytes_out(counts.reply_bytes);
    traffic->set_floats_in(counts.request_floats);
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ParameterServerService::Rejoin(grpc::CallbackServerContext* context,
                                                         const v1::RejoinRequest* request,
                                                         v1::RejoinResponse* response) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("Rejoin", caller));
  }
  auto refuse = [&](const absl::Status& status) {
    return FinishWith(context, shard_.Refusal(Prefixed(
                                   absl::StrCat("Rejoin (rank ", request->rank(), ", step ",
                                                request->step(), ")"),
                                   status)));
  };
  absl::Status ok = shard_.Admit(request->fingerprint(), request->rank(), options_.now());
  if (!ok.ok()) return refuse(ok);
  const uint32_t every = config_.cluster().admit_every_steps();
  if (every == 0) {
    return refuse(absl::FailedPreconditionError(
        "this job admits no rank back: its cluster.admit_every_steps is 0"));
  }
  if (request->step() == 0 || request->step() % every != 0) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "step must be a multiple of cluster.admit_every_steps ", every, ", the steps whose "
        "full average admits ranks")));
  }
  ok = rounds_.Admit(request->rank(), request->step());
  if (!ok.ok()) return refuse(ok);
  response->set_members(rounds_.members());
  spdlog::info("shard {}: rank {} admitted back from the full average of step {}, {} members",
               shard_.shard(), request->rank(), request->step(), response->members());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ParameterServerService::RollBack(grpc::CallbackServerContext* context,
                                                           const v1::RollBackRequest* request,
                                                           v1::RollBackResponse* /*response*/) {
  if (absl::Status caller = shard_.Authenticate(*context); !caller.ok()) {
    return FinishWith(context, Prefixed("RollBack", caller));
  }
  auto refuse = [&](const absl::Status& status) {
    return FinishWith(context, shard_.Refusal(Prefixed(
                                   absl::StrCat("RollBack (rank ", request->rank(), ", step ",
                                                request->step(), ")"),
                                   status)));
  };
  absl::Status ok = shard_.CheckFingerprint(request->fingerprint());
  if (!ok.ok()) return refuse(ok);
  // 0 is no shard's incarnation; it is what rolled_back_for says before any.
  if (request->restarted() == 0) {
    return refuse(absl::InvalidArgumentError(
        "restarted must be the incarnation of the shard that restarted (never 0)"));
  }
  absl::MutexLock lock(&roll_back_mu_);
  // A roll back that failed shut the shard down, after it may have recorded
  // it: the later callers must not take it for done.
  if (shut_down_.load()) {
    return refuse(absl::UnavailableError(
        absl::StrCat("server shard ", shard_.shard(), " is shutting down")));
  }
  // The restarted shard itself (which lost its registrations), or a roll
  // back another member started.
  const bool restarted_here = request->restarted() == shard_.incarnation();
  if (restarted_here || request->restarted() == shard_.rolled_back_for()) {
    if (request->step() != shard_.resumed_from_step()) {
      return refuse(absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard_.shard(), " is at the checkpoint of step ", shard_.resumed_from_step())));
    }
    if (!restarted_here) shard_.Acknowledge(request->rank());
    return FinishWith(context, absl::OkStatus());
  }
  ok = shard_.CheckMember(request->rank());
  if (!ok.ok()) return refuse(ok);
  const absl::StatusOr<AlgorithmInfo> algorithm = FindAlgorithm(config_.algorithm().name());
  if (!algorithm.ok() || !algorithm->rolls_back_in_place() || checkpoint_ == nullptr ||
      config_.checkpoint().dir().empty()) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "this job cannot roll back in place: ",
        checkpoint_ == nullptr || config_.checkpoint().dir().empty()
            ? "it takes no checkpoints"
            : absl::StrCat("algorithm ", config_.algorithm().name(),
                           " keeps state outside its checkpoint's files or averages in flight"),
        "; restart every process of the job with --resume")));
  }
  const uint64_t step = request->step();
  const std::string reason = absl::StrCat("shard ", shard_.shard(),
                                          " rolls back to the checkpoint of step ", step,
                                          ", which a restarted shard resumed from");
  // Every service's rounds stop before the model is loaded, and the ranks
  // that have not rolled back are refused before any takes pushes again: a
  // round completing or opened in between would mix the two timelines.
  const CheckpointReload reload = [&]() -> absl::StatusOr<std::vector<CheckpointSection>> {
    std::vector<CheckpointSection> sections;
    RETURN_IF_ERROR(rounds_.Restart(step, reason, [&]() -> absl::Status {
      ASSIGN_OR_RETURN(ResumedShard resumed, ResumeShard(config_, shard_.shard(), &store_));
      if (resumed.step != step) {
        return absl::FailedPreconditionError(
            absl::StrCat("the newest complete checkpoint in ", config_.checkpoint().dir(),
                         " is of step ", resumed.step, ", not ", step));
      }
      RETURN_IF_ERROR(ForgetPartsAfter(CheckpointJob::Of(config_), CheckpointRole::kShard,
                                       shard_.shard(), step));
      sections = std::move(resumed.sections);
      shard_.RecordRollBack(request->restarted(), step);
      return absl::OkStatus();
    }));
    return sections;
  };
  const absl::Status reloaded =
      on_roll_back_ ? on_roll_back_(step, reason, reload) : reload().status();
  if (!reloaded.ok()) {
    // The shard's model is no longer the one its rounds had reached.
    roll_back_failed_ = true;
    Shutdown();
    spdlog::error("shard {}: roll back failed, shutting down: {}", shard_.shard(),
                  reloaded.ToString());
    return refuse(reloaded);
  }
  checkpoint_->RollBack(step);
  shard_.Acknowledge(request->rank());
  spdlog::warn("shard {}: rolled back to the checkpoint of step {}, which a restarted shard "
               "resumed from", shard_.shard(), step);
  return FinishWith(context, absl::OkStatus());
}

}  // namespace cserps
