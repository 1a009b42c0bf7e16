#include "worker/ps/ps_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grbs.h"
#include "common/grpc_security.h"
#include "common/grpc_status.h"
#include "common/sparse_vector.h"
#include "common/status.h"
#include "common/traffic_counter.h"
#include "common/transport_security.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "worker/ps/bulk_channel.h"
#include "worker/ps/call_batch.h"
#include "worker/ps/push_pull_round.h"

namespace cserps {

namespace {

// A bulk port that does not answer this soon is given up for gRPC.
constexpr absl::Duration kBulkConnectTimeout = absl::Seconds(5);

// How Register's resumed_from_step reads in a message.
std::string StartName(uint64_t resumed_from_step) {
  return resumed_from_step == 0 ? std::string("no checkpoint (a fresh start)")
                                : absl::StrCat("the checkpoint of step ", resumed_from_step);
}

// Shard `s` (at `address`) resumed from `step`, shard `other` from
// `other_step`.
absl::Status StartsDiffer(uint32_t s, const std::string& address, uint64_t step, uint32_t other,
                          uint64_t other_step) {
  return absl::FailedPreconditionError(absl::StrCat(
      "shard ", s, " at ", address, " resumed from ", StartName(step), " but shard ", other,
      " from ", StartName(other_step),
      ": restart every server of the job, each with --resume and the same checkpoint.dir"));
}

// One RPC to one shard: what gRPC's callback API needs to outlive the call.
template <typename Request, typename Response>
struct ShardCall {
  std::unique_ptr<grpc::ClientContext> context;  // of the current attempt
  Request request;
  Response response;
  absl::Status status;  // of the last attempt
  uint32_t shard = 0;
  uint64_t count = 0;  // floats of the model range, where the call has one
};

// INVALID_ARGUMENT unless `size` is the job's model size.
absl::Status CheckModelSize(absl::string_view what, size_t size, uint64_t num_params) {
  if (size == num_params) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", size,
                                                 " floats, the job's model has ",
                                                 num_params));
}

// Starts every call with start(call, done), each to end by `deadline`,
// then waits for all of them; returns the first error, which names `what`,
// the shard and its address. With `retries` (null: none), the calls that
// fail RetryableAttempt (each attempt limited to `attempt_timeout`) are
// sent again after a Backoff while the deadline allows, and counted there.
template <typename Call, typename StartFn>
absl::Status RunAll(const std::vector<std::unique_ptr<Call>>& calls, absl::Time deadline,
                    absl::Duration attempt_timeout, absl::string_view what,
                    const std::vector<std::string>& addresses, std::atomic<int64_t>* waited,
                    std::atomic<uint64_t>* retries, StartFn start) {
  Backoff backoff(deadline);
  std::vector<Call*> pending;
  for (const auto& call : calls) pending.push_back(call.get());
  while (true) {
    CallBatch batch;
    const absl::Time attempt_deadline = AttemptDeadline(deadline, attempt_timeout);
    for (Call* call : pending) {
      call->context = std::make_unique<grpc::ClientContext>();
      SetDeadline(call->context.get(), attempt_deadline - absl::Now());
      batch.Add();
      const std::string context =
          absl::StrCat(what, " shard ", call->shard, " at ", addresses[call->shard]);
      start(*call, [&batch, call, context](grpc::Status status) {
        call->status = FromGrpcStatus(status, context);
        batch.Done(call->status);
      });
    }
    if (TimedWait(batch, waited).ok()) return absl::OkStatus();
    std::vector<Call*> again;
    for (Call* call : pending) {
      if (call->status.ok()) continue;
      if (retries == nullptr || !RetryableAttempt(call->status, attempt_deadline, deadline)) {
        return call->status;
      }
      again.push_back(call);
    }
    if (!backoff.Wait()) return backoff.Exhausted(again.front()->status);
    retries->fetch_add(again.size());
    spdlog::warn("{}; sending {} call(s) again (retry {})",
                 std::string(again.front()->status.message()), again.size(), backoff.retries());
    pending = std::move(again);
  }
}

// Copies each call's reply floats (`bytes_of(call)`) into `out` at its
// offset, once every reply holds as many as its call asked for: a shard
// that answers with another size (another layout, a corrupt reply) is
// DATA_LOSS, and `out` is left as it was.
template <typename Call, typename BytesOf>
absl::Status ScatterReplies(const std::vector<std::unique_ptr<Call>>& calls, BytesOf bytes_of,
                            const std::vector<std::string>& addresses, absl::string_view what,
                            absl::Span<float> out) {
  for (const auto& call : calls) {
    const std::string& bytes = bytes_of(*call);
    if (bytes.size() != call->count * sizeof(float)) {
      return absl::DataLossError(absl::StrCat(
          what, " reply from shard ", call->shard, " at ", addresses[call->shard],
          " for the floats from ", call->request.offset(), ": ", bytes.size(),
          " bytes, where ", call->count, " floats were asked for"));
    }
  }
  for (const auto& call : calls) {
    std::memcpy(out.data() + call->request.offset(), bytes_of(*call).data(),
                call->count * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace

// The channels, the stubs of every shard this client talks to, and the
// traffic counters.
struct PsClient::Impl {
  Impl(const v1::JobConfig& config, uint64_t num_params, PsClientOptions options)
      : config_(config),
        options_(options),
        layout_(num_params, config.algorithm().block_size(),
                config.cluster().servers_size()),
        chunk_floats_(ChunkFloats(config.cluster())),
        fingerprint_(JobFingerprint(config)) {}

  // The whole model cut per shard into chunks of at most chunk_floats_:
  // how PushModel, PullModel and AsyncPushPull send it.
  struct ModelChunk {
    uint32_t shard = 0;
    uint64_t offset = 0;  // global float index
    uint64_t count = 0;
  };
  std::vector<ModelChunk> ModelChunks() const;
  // A round's deadline, and one attempt's (AttemptDeadline): a synchronous
  // round's calls are answered within round_timeout_s.
  absl::Duration RoundTimeout() const {
    return absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack;
  }
  absl::Duration RoundAttemptTimeout() const {
    return absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack / 2;
  }
  // One call per chunk of ModelChunks, with its shard and float count set,
  // filled by fill(call, chunk's global offset).
  template <typename Call, typename Fill>
  std::vector<std::unique_ptr<Call>> ChunkCalls(Fill fill) const {
    std::vector<std::unique_ptr<Call>> calls;
    for (const ModelChunk& chunk : ModelChunks()) {
      auto call = std::make_unique<Call>();
      call->shard = chunk.shard;
      call->count = chunk.count;
      fill(*call, chunk.offset);
      calls.push_back(std::move(call));
    }
    return calls;
  }
  // The payload of every shard (this client's or not) in round
  // (stream, step, ratio), by shard.
  std::vector<ShardPayload> RoundPayloads(v1::Stream stream, uint64_t step,
                                          uint32_t ratio) const;
  RoundSetup MakeRoundSetup(v1::Stream stream, uint64_t step, uint32_t ratio,
                            float weight, float lr);
  bool TalksTo(uint32_t shard) const {
    return shard % options_.shard_stride == options_.shard_offset;
  }
  // The bulk channel of `shard`, (re)connected when it is offered and
  // wanted; null: the shard's rounds go over gRPC.
  std::shared_ptr<BulkChannel> BulkFor(uint32_t shard);
  // `waited` (a call that waited for `shard`'s channel until its deadline)
  // with why the channel is not ready, from one call that does not wait: a
  // refused TLS handshake or connection says so only there.
  absl::Status WhyUnreachable(uint32_t shard, const absl::Status& waited);
  template <typename Request, typename Response>
  absl::Status MemberCall(const char* name, uint32_t shard, uint64_t step, Request request,
                          grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*,
                                                                          const Request&,
                                                                          Response*));

  const v1::JobConfig config_;
  const PsClientOptions options_;
  const BlockLayout layout_;
  const uint64_t chunk_floats_;
  const uint64_t fingerprint_;
  std::vector<std::string> addresses_;
  // The shards this client talks to, ascending.
  std::vector<uint32_t> shards_;
  // By shard; null for a shard this client does not talk to.
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  std::vector<std::unique_ptr<v1::AsyncParameterServer::Stub>> async_stubs_;
  std::vector<std::unique_ptr<v1::SparseExchange::Stub>> sparse_stubs_;
  // By shard: the bulk port Register reported (0: none) and the channel.
  std::vector<uint32_t> bulk_ports_;
  bool secured_ = false;  // TLS or a token
  BulkChannel::Credentials bulk_credentials_;
  uint64_t resumed_from_step_ = 0;  // the shards' (Register)
  std::vector<std::shared_ptr<BulkChannel>> bulk_;
  uint32_t rank_ = 0;
  std::string worker_id_;  // the last Register's
  std::vector<uint64_t> incarnations_;  // by shard, as Register reported them
  std::atomic<int64_t> wait_nanos_{0};
  // Calls sent again after they lost their connection (RunAll, rounds).
  std::atomic<uint64_t> retries_{0};
  // By shard: the members its latest reply reported (0: none yet).
  std::unique_ptr<std::atomic<uint32_t>[]> members_;
  TrafficCounter total_;       // every call
  TrafficCounter streams_[4];  // PushPull, by v1::Stream value
  TrafficCounter sparse_;
  TrafficCounter async_;
};

PsClient::PsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PsClient::~PsClient() = default;

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const v1::JobConfig& config, uint64_t num_params, PsClientOptions options) {
  if (config.cluster().servers_size() == 0) {
    return absl::InvalidArgumentError("cluster.servers: no server addresses");
  }
  if (options.shard_stride == 0 || options.shard_offset >= options.shard_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PsClientOptions: shard_offset ", options.shard_offset,
        " must be below shard_stride ", options.shard_stride));
  }
  ASSIGN_OR_RETURN(const TransportSecurity security,
                   LoadTransportSecurity(config.security(), TlsRole::kWorker));
  auto impl = std::make_unique<Impl>(config, num_params, options);
  impl->secured_ = security.enabled();
  impl->bulk_credentials_.token = security.token;
  if (security.tls.has_value()) {
    ASSIGN_OR_RETURN(impl->bulk_credentials_.tls, TlsContext::ForClient(*security.tls));
  }
  impl->bulk_ports_.assign(config.cluster().servers_size(), 0);
  impl->incarnations_.assign(config.cluster().servers_size(), 0);
  impl->members_.reset(new std::atomic<uint32_t>[config.cluster().servers_size()]);
  for (int s = 0; s < config.cluster().servers_size(); ++s) impl->members_[s] = 0;
  impl->bulk_.resize(config.cluster().servers_size());
  for (const std::string& address : config.cluster().servers()) {
    const uint32_t shard = static_cast<uint32_t>(impl->addresses_.size());
    impl->addresses_.push_back(address);
    if (!impl->TalksTo(shard)) {
      impl->stubs_.push_back(nullptr);
      impl->async_stubs_.push_back(nullptr);
      impl->sparse_stubs_.push_back(nullptr);
      continue;
    }
    impl->shards_.push_back(shard);
    grpc::ChannelArguments args;
    const int max_bytes = static_cast<int>(config.cluster().max_message_bytes());
    args.SetMaxReceiveMessageSize(max_bytes);
    args.SetMaxSendMessageSize(max_bytes);
    // A job waits for its servers: reconnect within 2 s of one coming back
    // (gRPC's default backoff grows to 120 s), from 100 ms after a failure.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // The client sends lost calls again itself (RunAll, the rounds): gRPC's
    // own retries left a call waiting for its deadline, now and then, after
    // connection resets (tests/integration/fault_injection_test.cc).
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    std::shared_ptr<grpc::Channel> channel = MakeChannel(address, security, args);
    impl->stubs_.push_back(v1::ParameterServer::NewStub(channel));
    impl->async_stubs_.push_back(v1::AsyncParameterServer::NewStub(channel));
    impl->sparse_stubs_.push_back(v1::SparseExchange::NewStub(channel));
  }
  return std::unique_ptr<PsClient>(new PsClient(std::move(impl)));
}

absl::StatusOr<uint32_t> PsClient::Register(int requested_rank,
                                            const std::string& worker_id) {
  if (impl_->shards_.empty() && requested_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Register: this client talks to no shard (shard_offset ", impl_->options_.shard_offset,
        " of stride ", impl_->options_.shard_stride, ", ", impl_->addresses_.size(),
        " shards), so it must be given its rank"));
  }
  int rank = requested_rank;
  // One deadline for every shard: a node's local ranks wait for this one
  // no longer than max(round, setup) timeouts (node_client.h).
  const absl::Time deadline = absl::Now() + impl_->options_.setup_timeout;
  for (uint32_t s : impl_->shards_) {
    v1::RegisterRequest request;
    *request.mutable_config() = impl_->config_;
    request.mutable_config()->clear_security();  // local paths, none of the server's business
    request.set_requested_rank(rank);
    request.set_worker_id(worker_id);
    v1::RegisterResponse response;
    // Until the deadline: an elastic job's replacement waits here for the
    // shards to drop the rank it takes.
    Backoff backoff(deadline);
    while (true) {
      grpc::ClientContext context;
      SetDeadline(&context, deadline - absl::Now());
      const absl::Status registered = FromGrpcStatus(
          impl_->stubs_[s]->Register(&context, request, &response),
          absl::StrCat("Register with shard ", s, " at ", impl_->addresses_[s]));
      if (registered.ok()) break;
      if (absl::IsDeadlineExceeded(registered)) return impl_->WhyUnreachable(s, registered);
      // The same worker id gets the same rank again.
      if (!Retryable(registered)) return registered;
      if (!backoff.Wait()) return backoff.Exhausted(registered);
      impl_->retries_.fetch_add(1);
    }
    if (response.model_size() != impl_->layout_.num_params() ||
        response.shard().shard() != s) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " at ", impl_->addresses_[s], " reports shard ",
          response.shard().shard(), " with a model of ", response.model_size(),
          " floats; this worker expects shard ", s, " of a model of ",
          impl_->layout_.num_params(), " floats: check the order of cluster.servers"));
    }
    if (s != impl_->shards_.front() && response.resumed_from_step() != impl_->resumed_from_step_) {
      return StartsDiffer(s, impl_->addresses_[s], response.resumed_from_step(),
                          impl_->shards_.front(), impl_->resumed_from_step_);
    }
    impl_->resumed_from_step_ = response.resumed_from_step();
    rank = static_cast<int>(response.rank());
    impl_->bulk_ports_[s] = response.bulk_port();
    // A restarted shard: the old channel went to the process that died.
    if (impl_->incarnations_[s] != response.incarnation()) impl_->bulk_[s] = nullptr;
    impl_->incarnations_[s] = response.incarnation();
  }
  impl_->rank_ = static_cast<uint32_t>(rank);
  impl_->worker_id_ = worker_id;
  for (uint32_t s : impl_->shards_) impl_->BulkFor(s);
  return impl_->rank_;
}

absl::Status PsClient::Impl::WhyUnreachable(uint32_t shard, const absl::Status& waited) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetStatusResponse response;
  const grpc::Status probe = stubs_[shard]->GetStatus(&context, v1::GetStatusRequest(), &response);
  if (probe.error_code() != grpc::StatusCode::UNAVAILABLE) return waited;
  return absl::Status(waited.code(),
                      absl::StrCat(waited.message(), "; the connection fails: ",
                                   probe.error_message(),
                                   secured_ ? " (with TLS: is this worker's security.cert signed "
                                              "by the job's CA, and the server's valid for "
                                              "this address?)"
                                            : ""));
}

std::shared_ptr<BulkChannel> PsClient::Impl::BulkFor(uint32_t shard) {
  if (config_.cluster().transport() == v1::ClusterConfig::GRPC || bulk_ports_[shard] == 0) {
    return nullptr;
  }
  if (bulk_[shard] != nullptr && !bulk_[shard]->broken()) return bulk_[shard];
  const std::string name =
      absl::StrCat("shard ", shard, " at ", addresses_[shard], " (bulk port ", bulk_ports_[shard], ")");
  std::string host;
  int port = 0;
  absl::Status ok = SplitHostPort(addresses_[shard], &host, &port);
  absl::StatusOr<std::unique_ptr<BulkChannel>> channel =
      ok.ok() ? BulkChannel::Connect(host, static_cast<int>(bulk_ports_[shard]), fingerprint_,
                                     rank_, bulk_credentials_, absl::Now() + kBulkConnectTimeout,
                                     name)
              : absl::StatusOr<std::unique_ptr<BulkChannel>>(ok);
  if (!channel.ok()) {
    // A firewalled or unpublished bulk port costs speed, not the job.
    spdlog::warn("{}; its rounds go over gRPC", channel.status().ToString());
    bulk_[shard] = nullptr;
    bulk_ports_[shard] = 0;
    return nullptr;
  }
  bulk_[shard] = *std::move(channel);
  return bulk_[shard];
}

std::vector<PsClient::Impl::ModelChunk> PsClient::Impl::ModelChunks() const {
  std::vector<ModelChunk> chunks;
  for (uint32_t s : shards_) {
    for (uint64_t off = layout_.ShardFirstFloat(s); off < layout_.ShardEndFloat(s);
         off += chunk_floats_) {
      chunks.push_back({s, off, std::min(chunk_floats_, layout_.ShardEndFloat(s) - off)});
    }
  }
  return chunks;
}

uint32_t PsClient::rank() const { return impl_->rank_; }
uint64_t PsClient::resumed_from_step() const { return impl_->resumed_from_step_; }

absl::Status PsClient::AgreeResumedFromStep(uint64_t node_step) {
  if (impl_->shards_.empty()) {
    impl_->resumed_from_step_ = node_step;
    return absl::OkStatus();
  }
  if (impl_->resumed_from_step_ == node_step) return absl::OkStatus();
  const uint32_t s = impl_->shards_.front();
  return StartsDiffer(s, impl_->addresses_[s], impl_->resumed_from_step_, 0, node_step);
}

uint64_t PsClient::retries() const { return impl_->retries_.load(); }
uint32_t PsClient::members() const {
  uint32_t fewest = impl_->config_.cluster().num_workers();
  bool heard = false;
  for (uint32_t s : impl_->shards_) {
    const uint32_t members = impl_->members_[s].load();
    if (members == 0) continue;
    fewest = heard ? std::min(fewest, members) : members;
    heard = true;
  }
  return fewest;
}
const BlockLayout& PsClient::layout() const { return impl_->layout_; }
uint64_t PsClient::bytes_pushed() const { return impl_->total_.Snapshot().request_bytes; }
uint64_t PsClient::bytes_pulled() const { return impl_->total_.Snapshot().reply_bytes; }
absl::Duration PsClient::wait_time() const {
  return absl::Nanoseconds(impl_->wait_nanos_.load());
}
TrafficCounts PsClient::traffic(v1::Stream stream) const {
  return impl_->streams_[stream].Snapshot();
}
TrafficCounts PsClient::sparse_traffic() const { return impl_->sparse_.Snapshot(); }
TrafficCounts PsClient::async_traffic() const { return impl_->async_.Snapshot(); }

std::vector<ShardPayload> PsClient::Impl::RoundPayloads(v1::Stream stream, uint64_t step,
                                                 uint32_t ratio) const {
  std::vector<ShardPayload> payloads;
  std::vector<uint64_t> blocks;
  if (ratio != 1) {
    blocks = SelectBlocks(config_.seed(), stream, step, ratio, layout_.num_blocks());
  }
  for (uint32_t s = 0; s < stubs_.size(); ++s) {
    if (!TalksTo(s)) {
      payloads.emplace_back();
    } else if (ratio == 1) {
      payloads.push_back(ShardPayload::AllBlocks(layout_, s));
    } else {
      payloads.push_back(ShardPayload::SelectedBlocks(layout_, s, blocks));
    }
  }
  return payloads;
}

RoundSetup PsClient::Impl::MakeRoundSetup(v1::Stream stream, uint64_t step, uint32_t ratio,
                                    float weight, float lr) {
  RoundSetup setup;
  setup.stubs = &stubs_;
  setup.addresses = &addresses_;
  setup.fingerprint = fingerprint_;
  setup.rank = rank_;
  setup.stream = stream;
  setup.step = step;
  setup.ratio = ratio;
  setup.weight = weight;
  setup.lr = lr;
  setup.chunk_floats = chunk_floats_;
  setup.bulk.assign(addresses_.size(), nullptr);
  for (uint32_t s : shards_) setup.bulk[s] = BulkFor(s);
  setup.deadline = RoundTimeout();
  setup.attempt_timeout = RoundAttemptTimeout();
  setup.total = &total_;
  setup.traffic = &streams_[stream];
  setup.waited_nanos = &wait_nanos_;
  setup.retries = &retries_;
  setup.members = members_.get();
  return setup;
}

absl::Status PsClient::AverageBlocks(v1::Stream stream, uint64_t step, uint32_t ratio,
                                     absl::Span<const float> values, float weight,
                                     float lr, absl::Span<float> mean) {
  const uint64_t d = impl_->layout_.num_params();
  RETURN_IF_ERROR(CheckModelSize("AverageBlocks: values", values.size(), d));
  RETURN_IF_ERROR(CheckModelSize("AverageBlocks: mean", mean.size(), d));
  return RunHostSpanRound(impl_->MakeRoundSetup(stream, step, ratio, weight, lr),
                          impl_->RoundPayloads(stream, step, ratio), values, mean);
}

std::unique_ptr<ShardedAverage> PsClient::BeginShardedAverage(v1::Stream stream,
                                                              uint64_t step,
                                                              uint32_t ratio,
                                                              float weight, float lr) {
  std::vector<uint64_t> sizes;
  for (const ShardPayload& p : impl_->RoundPayloads(stream, step, ratio)) sizes.push_back(p.size());
  return MakePushPullRound(impl_->MakeRoundSetup(stream, step, ratio, weight, lr),
                           std::move(sizes));
}

absl::Status PsClient::PushModel(absl::Span<const float> model) {
  Impl& impl = *impl_;
  RETURN_IF_ERROR(CheckModelSize("PushModel: model", model.size(), impl.layout_.num_params()));
  using Call = ShardCall<v1::PushModelRequest, v1::PushModelResponse>;
  const auto calls = impl.ChunkCalls<Call>([&](Call& call, uint64_t offset) {
    call.request.set_fingerprint(impl.fingerprint_);
    call.request.set_rank(impl.rank_);
    call.request.set_offset(offset);
    AppendFloats(model.subspan(offset, call.count), call.request.mutable_values());
    impl.total_.AddRequest(call.request.ByteSizeLong());
  });
  return RunAll(calls, absl::Now() + impl.options_.setup_timeout, impl.options_.setup_timeout,
                "PushModel to", impl.addresses_, &impl.wait_nanos_, &impl.retries_,
                [&](Call& c, auto done) {
                  impl.stubs_[c.shard]->async()->PushModel(c.context.get(), &c.request,
                                                           &c.response, std::move(done));
                });
}

absl::Status PsClient::PullModel(absl::Span<float> model, bool wait_for_init) {
  Impl& impl = *impl_;
  RETURN_IF_ERROR(CheckModelSize("PullModel: model", model.size(), impl.layout_.num_params()));
  using Call = ShardCall<v1::PullModelRequest, v1::PullModelResponse>;
  const auto calls = impl.ChunkCalls<Call>([&](Call& call, uint64_t offset) {
    call.request.set_fingerprint(impl.fingerprint_);
    call.request.set_offset(offset);
    call.request.set_count(call.count);
    call.request.set_wait_for_init(wait_for_init);
  });
  RETURN_IF_ERROR(RunAll(calls, absl::Now() + impl.options_.setup_timeout,
                         impl.options_.setup_timeout, "PullModel from", impl.addresses_,
                         &impl.wait_nanos_, &impl.retries_,
                         [&](Call& c, auto done) {
                           impl.stubs_[c.shard]->async()->PullModel(
                               c.context.get(), &c.request, &c.response, std::move(done));
                         }));
  for (const auto& call : calls) impl.total_.AddReply(call->response.ByteSizeLong());
  return ScatterReplies(
      calls, [](const Call& c) -> const std::string& { return c.response.values(); },
      impl.addresses_, "PullModel", model);
}

absl::Status PsClient::AsyncPushPull(uint64_t step, float lr, absl::Span<const float> grad,
                                     absl::Span<float> model) {
  Impl& impl = *impl_;
  RETURN_IF_ERROR(
      CheckModelSize("AsyncPushPull: gradient", grad.size(), impl.layout_.num_params()));
  RETURN_IF_ERROR(CheckModelSize("AsyncPushPull: model", model.size(), impl.layout_.num_params()));
  using Call = ShardCall<v1::AsyncPushPullRequest, v1::AsyncPushPullResponse>;
  // A held-back push waits at most until the slowest rank is declared dead,
  // round_timeout_s after it went silent.
  const absl::Duration timeout = impl.RoundTimeout();
  const absl::Time deadline = absl::Now() + timeout;
  // gRPC calls not yet run; run_grpc_calls runs them and reads each reply
  // into `model`.
  std::vector<std::unique_ptr<Call>> calls;
  // A retry's bytes are traffic, its floats were counted the first time.
  auto add_grpc_call = [&](const Impl::ModelChunk& chunk, bool retry) {
    auto call = std::make_unique<Call>();
    call->shard = chunk.shard;
    call->count = chunk.count;
    call->request.set_fingerprint(impl.fingerprint_);
    call->request.set_rank(impl.rank_);
    call->request.set_step(step);
    call->request.set_lr(lr);
    call->request.set_offset(chunk.offset);
    AppendFloats(grad.subspan(chunk.offset, chunk.count), call->request.mutable_gradient());
    impl.total_.AddRequest(call->request.ByteSizeLong());
    impl.async_.AddRequest(call->request.ByteSizeLong(), retry ? 0 : chunk.count);
    calls.push_back(std::move(call));
  };
  auto run_grpc_calls = [&]() -> absl::Status {
    // A push sent again is applied once per (rank, offset, step).
    // Retries too end by the call's deadline.
    RETURN_IF_ERROR(RunAll(calls, deadline, timeout, "AsyncPushPull to", impl.addresses_,
                           &impl.wait_nanos_, &impl.retries_, [&](Call& c, auto done) {
                             impl.async_stubs_[c.shard]->async()->AsyncPushPull(
                                 c.context.get(), &c.request, &c.response, std::move(done));
                           }));
    for (const auto& call : calls) {
      impl.total_.AddReply(call->response.ByteSizeLong());
      impl.async_.AddReply(call->response.ByteSizeLong());
    }
    RETURN_IF_ERROR(ScatterReplies(
        calls, [](const Call& c) -> const std::string& { return c.response.model(); },
        impl.addresses_, "AsyncPushPull", model));
    calls.clear();
    return absl::OkStatus();
  };
  struct BulkPush {
    Impl::ModelChunk chunk;
    std::shared_ptr<BulkChannel> bulk;
    uint64_t id = 0;
  };
  std::vector<BulkPush> bulk_pushes;
  // A reply may still come for a bulk push this call gives up on: it must
  // land before the caller's `model` may be gone.
  absl::Cleanup wait_for_bulk = [&] {
    for (BulkPush& push : bulk_pushes) {
      if (push.bulk != nullptr) push.bulk->Wait(push.id, deadline).IgnoreError();
    }
  };
  // Every chunk leaves before this member waits for any: a push held back
  // by the staleness bound must not hold up this member's other pushes.
  for (const Impl::ModelChunk& chunk : impl.ModelChunks()) {
    if (std::shared_ptr<BulkChannel> bulk = impl.BulkFor(chunk.shard); bulk != nullptr) {
      absl::StatusOr<uint64_t> id =
          bulk->SendAsync(step, lr, chunk.offset, grad.subspan(chunk.offset, chunk.count),
                          model.subspan(chunk.offset, chunk.count), deadline);
      if (id.ok()) {
        const uint64_t bytes = bulk::AsyncRequest::kBytes + chunk.count * sizeof(float);
        impl.total_.AddRequest(bytes);
        impl.async_.AddRequest(bytes, chunk.count);
        bulk_pushes.push_back({chunk, bulk, *id});
        continue;
      }
      if (!Retryable(id.status())) return id.status();
    }
    add_grpc_call(chunk, /*retry=*/false);
  }
  RETURN_IF_ERROR(run_grpc_calls());
  // Pushes whose bulk channel broke go again over gRPC (a retry is answered
  // with the current floats, never applied twice).
  const absl::Time waiting = absl::Now();
  for (BulkPush& push : bulk_pushes) {
    absl::Status replied = std::exchange(push.bulk, nullptr)->Wait(push.id, deadline);
    if (replied.ok()) {
      const uint64_t bytes = bulk::Reply::kBytes + push.chunk.count * sizeof(float);
      impl.total_.AddReply(bytes);
      impl.async_.AddReply(bytes);
      continue;
    }
    if (!Retryable(replied)) return replied;
    spdlog::warn("{}; sending the asynchronous push of step {} at offset {} again over gRPC",
                 std::string(replied.message()), step, push.chunk.offset);
    impl.retries_.fetch_add(1);
    add_grpc_call(push.chunk, /*retry=*/true);
  }
  impl.wait_nanos_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - waiting));
  return run_grpc_calls();
}

absl::Status PsClient::ExchangeSparse(uint64_t step, const SparseVector& local,
                                      SparseVector* result) {
  const uint64_t d = impl_->layout_.num_params();
  if (local.indices.size() != local.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExchangeSparse: ", local.indices.size(), " indices but ", local.values.size(), " values"));
  }
  using Call = ShardCall<v1::SparsePushPullRequest, v1::SparsePushPullResponse>;
  const uint64_t k = SparseK(impl_->config_.algorithm(), d);
  const absl::Duration timeout = impl_->RoundTimeout();
  const absl::Time deadline = absl::Now() + timeout;
  // By shard: its entries of `local` [begin, end), its k_s, and its reply.
  struct Share {
    uint32_t shard = 0;
    size_t begin = 0, end = 0;
    uint64_t k = 0;
    SparseVector reply;
    std::shared_ptr<BulkChannel> bulk;
    uint64_t bulk_id = 0;
  };
  std::vector<Share> shares;
  size_t pos = 0;
  for (uint32_t s = 0; s < impl_->sparse_stubs_.size(); ++s) {
    const uint64_t size = impl_->layout_.ShardSize(s);
    if (size == 0) continue;
    const size_t begin = pos;
    const uint64_t end = impl_->layout_.ShardEndFloat(s);
    while (pos < local.indices.size() && local.indices[pos] < end) ++pos;
    if (!impl_->TalksTo(s)) continue;
    Share& share = shares.emplace_back();
    share.shard = s;
    share.begin = begin;
    share.end = pos;
    share.k = ShardSparseK(k, size, d);
  }
  if (pos != local.indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExchangeSparse: index ", local.indices[pos], " at position ", pos,
                     " is not below the model size ", d, " or the indices are not ascending"));
  }
  // The shards' replies hold at most as many entries as a message (the
  // shards refuse to start otherwise, docs/protocol.md 14.3).
  const uint64_t max_entries = impl_->chunk_floats_ / 2;
  // gRPC calls not yet run; run_grpc_calls runs them and puts each reply
  // in its share.
  std::vector<std::unique_ptr<Call>> calls;
  // A retry's bytes are traffic, its entries were counted the first time.
  auto add_grpc_call = [&](const Share& share, bool retry) {
    auto call = std::make_unique<Call>();
    call->shard = share.shard;
    v1::SparsePushPullRequest& request = call->request;
    request.set_fingerprint(impl_->fingerprint_);
    request.set_rank(impl_->rank_);
    request.set_step(step);
    request.set_k(share.k);
    const size_t n = share.end - share.begin;
    request.mutable_indices()->assign(
        reinterpret_cast<const char*>(local.indices.data() + share.begin), n * sizeof(uint32_t));
    request.mutable_values()->assign(
        reinterpret_cast<const char*>(local.values.data() + share.begin), n * sizeof(float));
    impl_->total_.AddRequest(request.ByteSizeLong());
    impl_->sparse_.AddRequest(request.ByteSizeLong(), retry ? 0 : n);
    calls.push_back(std::move(call));
  };
  auto run_grpc_calls = [&]() -> absl::Status {
    // Retries too end by the exchange's deadline.
    RETURN_IF_ERROR(RunAll(calls, deadline, impl_->RoundAttemptTimeout(), "SparsePushPull to",
                           impl_->addresses_, &impl_->wait_nanos_, &impl_->retries_,
                           [&](auto& c, auto done) {
                             impl_->sparse_stubs_[c.shard]->async()->SparsePushPull(
                                 c.context.get(), &c.request, &c.response, std::move(done));
                           }));
    for (const auto& call : calls) {
      const std::string& indices = call->response.indices();
      const std::string& values = call->response.values();
      impl_->total_.AddReply(call->response.ByteSizeLong());
      impl_->sparse_.AddReply(call->response.ByteSizeLong());
      if (indices.size() % 4 != 0 || indices.size() != values.size()) {
        return absl::DataLossError(absl::StrCat("shard ", call->shard, " answered sparse step ",
                                                step, " with ", indices.size(),
                                                " index bytes and ", values.size(),
                                                " value bytes"));
      }
      SparseVector& reply =
          std::find_if(shares.begin(), shares.end(),
                       [&](const Share& share) { return share.shard == call->shard; })
              ->reply;
      reply.indices.resize(indices.size() / 4);
      reply.values.resize(values.size() / 4);
      if (!indices.empty()) {
        std::memcpy(reply.indices.data(), indices.data(), indices.size());
        std::memcpy(reply.values.data(), values.data(), values.size());
      }
    }
    calls.clear();
    return absl::OkStatus();
  };
  // A reply may still come for a bulk push this call gives up on: it must
  // land before `shares` are gone.
  absl::Cleanup wait_for_bulk = [&] {
    for (Share& share : shares) {
      if (share.bulk != nullptr) share.bulk->Wait(share.bulk_id, deadline).IgnoreError();
    }
  };
  // Every shard's push leaves before this member waits for any: a member
  // waiting on one shard before pushing to another could hold up a round
  // that another member's wait depends on.
  for (Share& share : shares) {
    share.bulk = impl_->BulkFor(share.shard);
    if (share.bulk != nullptr) {
      const size_t n = share.end - share.begin;
      absl::StatusOr<uint64_t> id = share.bulk->SendSparse(
          step, static_cast<uint32_t>(share.k),
          absl::MakeConstSpan(local.indices).subspan(share.begin, n),
          absl::MakeConstSpan(local.values).subspan(share.begin, n), &share.reply, max_entries,
          deadline);
      if (id.ok()) {
        share.bulk_id = *id;
        const uint64_t bytes = bulk::SparseRequest::kBytes + n * (sizeof(uint32_t) + sizeof(float));
        impl_->total_.AddRequest(bytes);
        impl_->sparse_.AddRequest(bytes, n);
        continue;
      }
      if (!Retryable(id.status())) return id.status();
      share.bulk = nullptr;
    }
    add_grpc_call(share, /*retry=*/false);
  }
  RETURN_IF_ERROR(run_grpc_calls());
  // Shares whose bulk channel broke go again over gRPC (a retry is answered
  // from its round, never counted twice).
  const absl::Time waiting = absl::Now();
  for (Share& share : shares) {
    if (share.bulk == nullptr) continue;
    absl::Status replied = std::exchange(share.bulk, nullptr)->Wait(share.bulk_id, deadline);
    if (replied.ok()) {
      const uint64_t bytes =
          bulk::Reply::kBytes + share.reply.indices.size() * (sizeof(uint32_t) + sizeof(float));
      impl_->total_.AddReply(bytes);
      impl_->sparse_.AddReply(bytes);
      continue;
    }
    if (!Retryable(replied)) return replied;
    spdlog::warn("{}; sending shard {}'s sparse push of step {} again over gRPC",
                 std::string(replied.message()), share.shard, step);
    impl_->retries_.fetch_add(1);
    add_grpc_call(share, /*retry=*/true);
  }
  impl_->wait_nanos_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - waiting));
  RETURN_IF_ERROR(run_grpc_calls());
  // The caller writes through the replies' indices: a shard of another
  // layout, or a corrupt reply, must not reach outside its floats.
  for (const Share& share : shares) {
    const absl::Status inside =
        CheckSparseIndices(share.reply.indices, impl_->layout_.ShardFirstFloat(share.shard),
                           impl_->layout_.ShardEndFloat(share.shard));
    if (!inside.ok()) {
      return absl::DataLossError(absl::StrCat("shard ", share.shard, " answered sparse step ",
                                              step, " with ", inside.message()));
    }
  }
  result->indices.clear();
  result->values.clear();
  for (const Share& share : shares) {
    result->indices.insert(result->indices.end(), share.reply.indices.begin(),
                           share.reply.indices.end());
    result->values.insert(result->values.end(), share.reply.values.begin(),
                          share.reply.values.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GetStatusResponse> PsClient::GetStatus(uint32_t shard) {
  if (shard >= impl_->stubs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no shard ", shard));
  }
  if (!impl_->TalksTo(shard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetStatus: shard ", shard, " is not one this client talks to"));
  }
  grpc::ClientContext context;
  SetDeadline(&context, impl_->options_.setup_timeout);
  v1::GetStatusResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(
      impl_->stubs_[shard]->GetStatus(&context, v1::GetStatusRequest(), &response),
      absl::StrCat("GetStatus of shard ", shard, " at ", impl_->addresses_[shard])));
  return response;
}

absl::Status PsClient::Reregister() {
  return Register(static_cast<int>(impl_->rank_), impl_->worker_id_).status();
}

uint64_t PsClient::incarnation(uint32_t shard) const {
  return shard < impl_->incarnations_.size() ? impl_->incarnations_[shard] : 0;
}

// One of this member's membership calls to `shard` (Rejoin, RollBack):
// `request` gets the fingerprint, rank and step; `call` is the stub's method.
template <typename Request, typename Response>
absl::Status PsClient::Impl::MemberCall(
    const char* name, uint32_t shard, uint64_t step, Request request,
    grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*, const Request&,
                                                    Response*)) {
  if (shard >= stubs_.size() || !TalksTo(shard)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": shard ", shard, " is not one this client talks to"));
  }
  request.set_fingerprint(fingerprint_);
  request.set_rank(rank_);
  request.set_step(step);
  grpc::ClientContext context;
  SetDeadline(&context, options_.setup_timeout);
  Response response;
  return FromGrpcStatus((stubs_[shard].get()->*call)(&context, request, &response),
                        absl::StrCat(name, " of shard ", shard, " at ", addresses_[shard]));
}

absl::Status PsClient::RollBack(uint32_t shard, uint64_t step, uint64_t restarted) {
  v1::RollBackRequest request;
  request.set_restarted(restarted);
  return impl_->MemberCall("RollBack", shard, step, std::move(request),
                           &v1::ParameterServer::Stub::RollBack);
}

absl::Status PsClient::Rejoin(uint32_t shard, uint64_t step) {
  return impl_->MemberCall("Rejoin", shard, step, v1::RejoinRequest(),
                           &v1::ParameterServer::Stub::Rejoin);
}

}  // namespace cserps
