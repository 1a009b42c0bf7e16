#include "worker/ps/ps_client.h"

#include <grpcpp/channel.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grbs.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/traffic_counter.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "worker/ps/bulk_channel.h"

namespace cserps {

// What a PushPull round needs of its client; every pointer outlives the
// round.
struct RoundSetup {
  const std::vector<std::unique_ptr<v1::ParameterServer::Stub>>* stubs = nullptr;
  const std::vector<std::string>* addresses = nullptr;
  uint64_t fingerprint = 0;
  uint32_t rank = 0;
  v1::Stream stream = v1::GRAD;
  uint64_t step = 0;
  uint32_t ratio = 1;
  float weight = 1;
  float lr = 0;
  uint64_t chunk_floats = 0;
  absl::Duration deadline;
  // By shard: the bulk channel its chunks go over; null (or empty): gRPC.
  std::vector<BulkChannel*> bulk;
  TrafficCounter* total = nullptr;   // every call's bytes
  TrafficCounter* traffic = nullptr;  // the stream's
  std::atomic<int64_t>* waited_nanos = nullptr;
};

namespace {

// A bulk port that does not answer this soon is given up for gRPC.
constexpr absl::Duration kBulkConnectTimeout = absl::Seconds(5);

// gRPC retries calls that fail UNAVAILABLE (a shard restarting, a
// connection reset); the server answers retried pushes from the round.
constexpr char kServiceConfig[] = R"({
  "methodConfig": [{
    "name": [{"service": "cserps.v1.ParameterServer"},
             {"service": "cserps.v1.AsyncParameterServer"},
             {"service": "cserps.v1.SparseExchange"}],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.1s",
      "maxBackoff": "2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
})";

// Counts the RPCs of one operation and keeps the first error.
class CallBatch {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  void Done(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
    --outstanding_;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &outstanding_));
    return first_error_;
  }

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// One RPC to one shard: what gRPC's callback API needs to outlive the call.
template <typename Request, typename Response>
struct ShardCall {
  grpc::ClientContext context;
  Request request;
  Response response;
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

// Adds the time spent in `wait` to *waited (nanoseconds).
absl::Status TimedWait(CallBatch& batch, std::atomic<int64_t>* waited) {
  const absl::Time start = absl::Now();
  absl::Status status = batch.Wait();
  waited->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start));
  return status;
}

// Starts every call with start(call, done), then waits for all of them;
// returns the first error, which names `what`, the shard and its address.
template <typename Call, typename StartFn>
absl::Status RunAll(const std::vector<std::unique_ptr<Call>>& calls,
                    absl::string_view what, const std::vector<std::string>& addresses,
                    std::atomic<int64_t>* waited, StartFn start) {
  CallBatch batch;
  for (const auto& call : calls) {
    batch.Add();
    const std::string context =
        absl::StrCat(what, " shard ", call->shard, " at ", addresses[call->shard]);
    start(*call, [&batch, context](grpc::Status status) {
      batch.Done(FromGrpcStatus(status, context));
    });
  }
  return TimedWait(batch, waited);
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(true);
}

struct PushPullCall {
  grpc::ClientContext context;
  v1::PushPullRequest request;
  v1::PushPullResponse response;
  uint32_t shard = 0;
  uint64_t begin = 0;  // payload offset of the chunk
  uint64_t count = 0;
};

// Where floats [begin, begin + count) of a shard's payload are in the
// caller's memory, as spans in payload order.
using PayloadSpans =
    std::function<void(uint64_t begin, uint64_t count, std::vector<absl::Span<const float>>*)>;
using MeanSpans =
    std::function<void(uint64_t begin, uint64_t count, std::vector<absl::Span<float>>*)>;

// One PushPull round, shard by shard: the chunking, the requests (gRPC, or
// the shard's bulk channel) and the checks of the replies, for AverageBlocks
// (which gathers from a model-sized vector) and for BeginShardedAverage
// (whose caller gathers).
class PushPullRound final : public ShardedAverage {
 public:
  // `payload_sizes`: by shard, 0 for the shards the round does not send to.
  PushPullRound(RoundSetup setup, std::vector<uint64_t> payload_sizes)
      : setup_(std::move(setup)), shard_state_(payload_sizes.size()) {
    for (uint32_t s = 0; s < payload_sizes.size(); ++s) {
      shard_state_[s] = std::make_unique<ShardState>();
      shard_state_[s]->size = payload_sizes[s];
      if (payload_sizes[s] > 0) shards_.push_back(s);
    }
  }
  ~PushPullRound() override {
    for (uint32_t s = 0; s < shard_state_.size(); ++s) {
      ShardState& state = *shard_state_[s];
      if (!state.started || state.waited) continue;
      if (state.channel != nullptr) {
        for (uint64_t id : state.bulk_ids) {
          state.channel->Wait(id, state.deadline).IgnoreError();
        }
      } else {
        state.batch.Wait().IgnoreError();
      }
    }
  }

  const std::vector<uint32_t>& shards() const override { return shards_; }
  uint64_t payload_size(uint32_t shard) const override {
    return shard < shard_state_.size() ? shard_state_[shard]->size : 0;
  }

  absl::Status StartShard(uint32_t shard, absl::Span<const float> payload,
                          absl::Span<float> mean) override {
    RETURN_IF_ERROR(CheckStartable(shard));
    const uint64_t size = shard_state_[shard]->size;
    if (payload.size() != size || mean.size() != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ShardedAverage step ", setup_.step, " shard ", shard, ": payload of ",
          payload.size(), " floats and mean of ", mean.size(),
          " floats; the shard's selected blocks hold ", size, " floats"));
    }
    std::vector<ShardSource> source(1);
    source[0].shard = shard;
    source[0].payload = [payload](uint64_t begin, uint64_t count,
                                  std::vector<absl::Span<const float>>* out) {
      out->push_back(payload.subspan(begin, count));
    };
    source[0].mean = [mean](uint64_t begin, uint64_t count,
                            std::vector<absl::Span<float>>* out) {
      out->push_back(mean.subspan(begin, count));
    };
    Start(std::move(source));
    return absl::OkStatus();
  }

  // A shard to start: where its payload's floats are, where its mean goes.
  struct ShardSource {
    uint32_t shard = 0;
    PayloadSpans payload;
    MeanSpans mean;
  };

  // Sends every chunk of each source's shard (one whose payload is not
  // empty, not yet started), chunk c of every shard before chunk c + 1 of
  // any, so that all shards have work at once; WaitShard writes the replies
  // where the source's `mean` says.
  void Start(std::vector<ShardSource> sources) {
    uint32_t most_chunks = 0;
    for (ShardSource& source : sources) {
      ShardState& state = *shard_state_[source.shard];
      state.started = true;
      state.mean = std::move(source.mean);
      state.deadline = absl::Now() + setup_.deadline;
      state.channel = setup_.bulk.empty() ? nullptr : setup_.bulk[source.shard];
      most_chunks = std::max(most_chunks, NumChunks(state.size, setup_.chunk_floats));
    }
    std::vector<absl::Span<const float>> values;
    for (uint32_t c = 0; c < most_chunks; ++c) {
      for (const ShardSource& source : sources) {
        ShardState& state = *shard_state_[source.shard];
        const uint64_t begin = c * setup_.chunk_floats;
        if (begin >= state.size) continue;
        const uint64_t count = std::min(setup_.chunk_floats, state.size - begin);
        values.clear();
        source.payload(begin, count, &values);
        if (state.channel != nullptr) {
          SendBulk(state, c, begin, count, values);
        } else {
          AddGrpcCall(state, source.shard, c, begin, count, values);
        }
      }
    }
    for (const ShardSource& source : sources) {
      ShardState& state = *shard_state_[source.shard];
      // Started once the shard's calls are complete: callbacks may run at once.
      for (auto& call : state.calls) {
        state.batch.Add();
        CallBatch* batch = &state.batch;
        const std::string context = absl::StrCat("PushPull to shard ", source.shard, " at ",
                                                 (*setup_.addresses)[source.shard]);
        (*setup_.stubs)[source.shard]->async()->PushPull(
            &call->context, &call->request, &call->response,
            [batch, context](grpc::Status status) {
              batch->Done(FromGrpcStatus(status, context));
            });
      }
    }
  }

  absl::Status WaitShard(uint32_t shard) override {
    if (shard >= shard_state_.size() || !shard_state_[shard]->started ||
        shard_state_[shard]->waited) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ShardedAverage step ", setup_.step, " shard ", shard,
          ": not started, or already awaited"));
    }
    ShardState& state = *shard_state_[shard];
    state.waited = true;
    if (state.channel != nullptr) return WaitBulk(state);
    RETURN_IF_ERROR(TimedWait(state.batch, setup_.waited_nanos));
    std::vector<absl::Span<float>> spans;
    for (const auto& call : state.calls) {
      const std::string& bytes = call->response.mean();
      if (bytes.size() != call->count * sizeof(float)) {
        return absl::DataLossError(absl::StrCat(
            "shard ", call->shard, " answered step ", call->request.step(),
            " chunk ", call->request.chunk(), " with ", bytes.size(),
            " bytes; expected ", call->count * sizeof(float)));
      }
      setup_.total->AddReply(call->response.ByteSizeLong());
      setup_.traffic->AddReply(call->response.ByteSizeLong());
      spans.clear();
      state.mean(call->begin, call->count, &spans);
      const char* from = bytes.data();
      for (absl::Span<float> span : spans) {
        std::memcpy(span.data(), from, span.size() * sizeof(float));
        from += span.size() * sizeof(float);
      }
    }
    return absl::OkStatus();
  }

 private:
  struct ShardState {
    uint64_t size = 0;
    bool started = false;
    bool waited = false;
    absl::Time deadline;
    MeanSpans mean;
    // gRPC
    CallBatch batch;
    std::vector<std::unique_ptr<PushPullCall>> calls;
    // bulk: the channel, the requests sent and their floats, the first error
    BulkChannel* channel = nullptr;
    std::vector<uint64_t> bulk_ids;
    std::vector<uint64_t> bulk_counts;
    absl::Status bulk_error;
  };

  void AddGrpcCall(ShardState& state, uint32_t shard, uint32_t chunk, uint64_t begin,
                   uint64_t count, absl::Span<const absl::Span<const float>> values) {
    auto call = std::make_unique<PushPullCall>();
    call->shard = shard;
    call->begin = begin;
    call->count = count;
    v1::PushPullRequest& request = call->request;
    request.set_fingerprint(setup_.fingerprint);
    request.set_rank(setup_.rank);
    request.set_step(setup_.step);
    request.set_stream(setup_.stream);
    request.set_ratio(setup_.ratio);
    request.set_chunk(chunk);
    request.set_weight(setup_.weight);
    request.set_lr(setup_.lr);
    std::string* bytes = request.mutable_values();
    // Appending copies once, where resizing first would also zero every byte.
    bytes->reserve(count * sizeof(float));
    for (absl::Span<const float> v : values) AppendFloats(v, bytes);
    setup_.total->AddRequest(request.ByteSizeLong());
    setup_.traffic->AddRequest(request.ByteSizeLong(), count);
    SetDeadline(&call->context, setup_.deadline);
    state.calls.push_back(std::move(call));
  }

  void SendBulk(ShardState& state, uint32_t chunk, uint64_t begin, uint64_t count,
                absl::Span<const absl::Span<const float>> values) {
    if (!state.bulk_error.ok()) return;
    std::vector<absl::Span<float>> mean;
    state.mean(begin, count, &mean);
    const bulk::Request request{.step = setup_.step,
                                .stream = static_cast<uint32_t>(setup_.stream),
                                .ratio = setup_.ratio,
                                .chunk = chunk,
                                .weight = setup_.weight,
                                .lr = setup_.lr};
    absl::StatusOr<uint64_t> id =
        state.channel->Send(request, values, std::move(mean), state.deadline);
    if (!id.ok()) {
      state.bulk_error = id.status();
      return;
    }
    const uint64_t bytes = bulk::Request::kBytes + count * sizeof(float);
    setup_.total->AddRequest(bytes);
    setup_.traffic->AddRequest(bytes, count);
    state.bulk_ids.push_back(*id);
    state.bulk_counts.push_back(count);
  }

  absl::Status WaitBulk(ShardState& state) {
    const absl::Time start = absl::Now();
    absl::Status status = state.bulk_error;
    for (size_t i = 0; i < state.bulk_ids.size(); ++i) {
      absl::Status one = state.channel->Wait(state.bulk_ids[i], state.deadline);
      if (one.ok()) {
        const uint64_t bytes = bulk::Reply::kBytes + state.bulk_counts[i] * sizeof(float);
        setup_.total->AddReply(bytes);
        setup_.traffic->AddReply(bytes);
      } else if (status.ok()) {
        status = std::move(one);
      }
    }
    setup_.waited_nanos->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start));
    return status;
  }

  absl::Status CheckStartable(uint32_t shard) const {
    if (shard >= shard_state_.size() || shard_state_[shard]->size == 0 ||
        shard_state_[shard]->started) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ShardedAverage step ", setup_.step, " shard ", shard,
          ": not one of the round's shards, or already started"));
    }
    return absl::OkStatus();
  }

  const RoundSetup setup_;
  std::vector<uint32_t> shards_;
  std::vector<std::unique_ptr<ShardState>> shard_state_;  // by shard
};

// AverageBlocks' round: payloads gathered from, and means scattered into,
// model-sized vectors.
class HostSpanRound final {
 public:
  HostSpanRound(RoundSetup setup, std::vector<ShardPayload> payloads,
                  absl::Span<float> mean)
      : payloads_(std::move(payloads)),
        mean_(mean),
        round_(std::move(setup), PayloadSizes(payloads_)) {}

  void Start(absl::Span<const float> values) {
    std::vector<PushPullRound::ShardSource> sources;
    for (uint32_t s : round_.shards()) {
      const ShardPayload& payload = payloads_[s];
      sources.push_back(
          {s,
           [&payload, values](uint64_t begin, uint64_t count,
                              std::vector<absl::Span<const float>>* out) {
             payload.ForEachPiece(begin, count, [&](uint64_t m, uint64_t, uint64_t n) {
               out->push_back(values.subspan(m, n));
             });
           },
           [&payload, mean = mean_](uint64_t begin, uint64_t count,
                                    std::vector<absl::Span<float>>* out) {
             payload.ForEachPiece(begin, count, [&](uint64_t m, uint64_t, uint64_t n) {
               out->push_back(mean.subspan(m, n));
             });
           }});
    }
    round_.Start(std::move(sources));
  }

  absl::Status Wait() {
    for (uint32_t s : round_.shards()) RETURN_IF_ERROR(round_.WaitShard(s));
    return absl::OkStatus();
  }

 private:
  static std::vector<uint64_t> PayloadSizes(const std::vector<ShardPayload>& payloads) {
    std::vector<uint64_t> sizes;
    for (const ShardPayload& p : payloads) sizes.push_back(p.size());
    return sizes;
  }

  const std::vector<ShardPayload> payloads_;
  absl::Span<float> mean_;
  PushPullRound round_;  // after payloads_, which its callbacks read
};

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
  // One call per chunk of ModelChunks, with its shard and float count set,
  // filled by fill(call, chunk's global offset) and given `timeout`.
  template <typename Call, typename Fill>
  std::vector<std::unique_ptr<Call>> ChunkCalls(absl::Duration timeout, Fill fill) const {
    std::vector<std::unique_ptr<Call>> calls;
    for (const ModelChunk& chunk : ModelChunks()) {
      auto call = std::make_unique<Call>();
      call->shard = chunk.shard;
      call->count = chunk.count;
      fill(*call, chunk.offset);
      SetDeadline(&call->context, timeout);
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
  BulkChannel* BulkFor(uint32_t shard);

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
  std::vector<std::unique_ptr<BulkChannel>> bulk_;
  uint32_t rank_ = 0;
  std::atomic<int64_t> wait_nanos_{0};
  TrafficCounter total_;       // every call
  TrafficCounter streams_[3];  // PushPull, by v1::Stream value
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
  auto impl = std::make_unique<Impl>(config, num_params, options);
  impl->bulk_ports_.assign(config.cluster().servers_size(), 0);
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
    args.SetInt("grpc.per_rpc_retry_buffer_size", max_bytes);
    args.SetServiceConfigJSON(kServiceConfig);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
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
  for (uint32_t s : impl_->shards_) {
    v1::RegisterRequest request;
    *request.mutable_config() = impl_->config_;
    request.set_requested_rank(rank);
    request.set_worker_id(worker_id);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, impl_->options_.setup_timeout);
    RETURN_IF_ERROR(FromGrpcStatus(
        impl_->stubs_[s]->Register(&context, request, &response),
        absl::StrCat("Register with shard ", s, " at ", impl_->addresses_[s])));
    if (response.model_size() != impl_->layout_.num_params() ||
        response.shard().shard() != s) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " at ", impl_->addresses_[s], " reports shard ",
          response.shard().shard(), " with a model of ", response.model_size(),
          " floats; this worker expects shard ", s, " of a model of ",
          impl_->layout_.num_params(), " floats: check the order of cluster.servers"));
    }
    rank = static_cast<int>(response.rank());
    impl_->bulk_ports_[s] = response.bulk_port();
  }
  impl_->rank_ = static_cast<uint32_t>(rank);
  for (uint32_t s : impl_->shards_) impl_->BulkFor(s);
  return impl_->rank_;
}

BulkChannel* PsClient::Impl::BulkFor(uint32_t shard) {
  if (config_.cluster().transport() == v1::ClusterConfig::GRPC || bulk_ports_[shard] == 0) {
    return nullptr;
  }
  if (bulk_[shard] != nullptr && !bulk_[shard]->broken()) return bulk_[shard].get();
  const std::string name =
      absl::StrCat("shard ", shard, " at ", addresses_[shard], " (bulk port ", bulk_ports_[shard], ")");
  std::string host;
  int port = 0;
  absl::Status ok = SplitHostPort(addresses_[shard], &host, &port);
  absl::StatusOr<std::unique_ptr<BulkChannel>> channel =
      ok.ok() ? BulkChannel::Connect(host, static_cast<int>(bulk_ports_[shard]), fingerprint_,
                                     rank_, absl::Now() + kBulkConnectTimeout, name)
              : absl::StatusOr<std::unique_ptr<BulkChannel>>(ok);
  if (!channel.ok()) {
    // A firewalled or unpublished bulk port costs speed, not the job.
    spdlog::warn("{}; its rounds go over gRPC", channel.status().ToString());
    bulk_[shard] = nullptr;
    bulk_ports_[shard] = 0;
    return nullptr;
  }
  bulk_[shard] = *std::move(channel);
  return bulk_[shard].get();
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
  setup.deadline = absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack;
  setup.total = &total_;
  setup.traffic = &streams_[stream];
  setup.waited_nanos = &wait_nanos_;
  return setup;
}

absl::Status PsClient::AverageBlocks(v1::Stream stream, uint64_t step, uint32_t ratio,
                                     absl::Span<const float> values, float weight,
                                     float lr, absl::Span<float> mean) {
  const uint64_t d = impl_->layout_.num_params();
  RETURN_IF_ERROR(CheckModelSize("AverageBlocks: values", values.size(), d));
  RETURN_IF_ERROR(CheckModelSize("AverageBlocks: mean", mean.size(), d));
  HostSpanRound round(impl_->MakeRoundSetup(stream, step, ratio, weight, lr),
                      impl_->RoundPayloads(stream, step, ratio), mean);
  round.Start(values);
  return round.Wait();
}

std::unique_ptr<ShardedAverage> PsClient::BeginShardedAverage(v1::Stream stream,
                                                              uint64_t step,
                                                              uint32_t ratio,
                                                              float weight, float lr) {
  std::vector<uint64_t> sizes;
  for (const ShardPayload& p : impl_->RoundPayloads(stream, step, ratio)) sizes.push_back(p.size());
  return std::make_unique<PushPullRound>(impl_->MakeRoundSetup(stream, step, ratio, weight, lr),
                                         std::move(sizes));
}

absl::Status PsClient::PushModel(absl::Span<const float> model) {
  Impl& impl = *impl_;
  RETURN_IF_ERROR(CheckModelSize("PushModel: model", model.size(), impl.layout_.num_params()));
  using Call = ShardCall<v1::PushModelRequest, v1::PushModelResponse>;
  const auto calls =
      impl.ChunkCalls<Call>(impl.options_.setup_timeout, [&](Call& call, uint64_t offset) {
        call.request.set_fingerprint(impl.fingerprint_);
        call.request.set_rank(impl.rank_);
        call.request.set_offset(offset);
        AppendFloats(model.subspan(offset, call.count), call.request.mutable_values());
        impl.total_.AddRequest(call.request.ByteSizeLong());
      });
  return RunAll(calls, "PushModel to", impl.addresses_, &impl.wait_nanos_, [&](Call& c, auto done) {
    impl.stubs_[c.shard]->async()->PushModel(&c.context, &c.request, &c.response, std::move(done));
  });
}

absl::Status PsClient::PullModel(absl::Span<float> model, bool wait_for_init) {
  Impl& impl = *impl_;
  RETURN_IF_ERROR(CheckModelSize("PullModel: model", model.size(), impl.layout_.num_params()));
  using Call = ShardCall<v1::PullModelRequest, v1::PullModelResponse>;
  const auto calls =
      impl.ChunkCalls<Call>(impl.options_.setup_timeout, [&](Call& call, uint64_t offset) {
        call.request.set_fingerprint(impl.fingerprint_);
        call.request.set_offset(offset);
        call.request.set_count(call.count);
        call.request.set_wait_for_init(wait_for_init);
      });
  RETURN_IF_ERROR(
      RunAll(calls, "PullModel from", impl.addresses_, &impl.wait_nanos_, [&](Call& c, auto done) {
        impl.stubs_[c.shard]->async()->PullModel(&c.context, &c.request, &c.response,
                                                 std::move(done));
      }));
  for (const auto& call : calls) {
    impl.total_.AddReply(call->response.ByteSizeLong());
    RETURN_IF_ERROR(BytesToFloats(call->response.values(),
                                  model.subspan(call->request.offset(), call->count),
                                  absl::StrCat("PullModel reply from shard ", call->shard)));
  }
  return absl::OkStatus();
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
  const absl::Duration timeout =
      absl::Seconds(impl.config_.cluster().round_timeout_s()) + impl.options_.rpc_slack;
  const auto calls = impl.ChunkCalls<Call>(timeout, [&](Call& call, uint64_t offset) {
    call.request.set_fingerprint(impl.fingerprint_);
    call.request.set_rank(impl.rank_);
    call.request.set_step(step);
    call.request.set_lr(lr);
    call.request.set_offset(offset);
    AppendFloats(grad.subspan(offset, call.count), call.request.mutable_gradient());
    impl.total_.AddRequest(call.request.ByteSizeLong());
    impl.async_.AddRequest(call.request.ByteSizeLong(), call.count);
  });
  RETURN_IF_ERROR(RunAll(calls, "AsyncPushPull to", impl.addresses_, &impl.wait_nanos_,
                         [&](Call& c, auto done) {
                           impl.async_stubs_[c.shard]->async()->AsyncPushPull(
                               &c.context, &c.request, &c.response, std::move(done));
                         }));
  for (const auto& call : calls) {
    impl.total_.AddReply(call->response.ByteSizeLong());
    impl.async_.AddReply(call->response.ByteSizeLong());
    RETURN_IF_ERROR(BytesToFloats(call->response.model(),
                                  model.subspan(call->request.offset(), call->count),
                                  absl::StrCat("AsyncPushPull reply from shard ", call->shard)));
  }
  return absl::OkStatus();
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
  std::vector<std::unique_ptr<Call>> calls;
  size_t pos = 0;
  for (uint32_t s = 0; s < impl_->sparse_stubs_.size(); ++s) {
    const uint64_t size = impl_->layout_.ShardSize(s);
    if (size == 0) continue;
    const size_t begin = pos;
    while (pos < local.indices.size() && local.indices[pos] < impl_->layout_.ShardEndFloat(s))
      ++pos;
    if (!impl_->TalksTo(s)) continue;
    auto call = std::make_unique<Call>();
    call->shard = s;
    v1::SparsePushPullRequest& request = call->request;
    request.set_fingerprint(impl_->fingerprint_);
    request.set_rank(impl_->rank_);
    request.set_step(step);
    request.set_k(ShardSparseK(k, size, d));
    request.mutable_indices()->assign(reinterpret_cast<const char*>(local.indices.data() + begin),
                                      (pos - begin) * sizeof(uint32_t));
    request.mutable_values()->assign(reinterpret_cast<const char*>(local.values.data() + begin),
                                     (pos - begin) * sizeof(float));
    impl_->total_.AddRequest(request.ByteSizeLong());
    impl_->sparse_.AddRequest(request.ByteSizeLong(), pos - begin);
    SetDeadline(&call->context, absl::Seconds(impl_->config_.cluster().round_timeout_s()) +
                                    impl_->options_.rpc_slack);
    calls.push_back(std::move(call));
  }
  if (pos != local.indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExchangeSparse: index ", local.indices[pos], " at position ", pos,
                     " is not below the model size ", d, " or the indices are not ascending"));
  }
  RETURN_IF_ERROR(RunAll(calls, "SparsePushPull to", impl_->addresses_, &impl_->wait_nanos_,
                         [&](auto& c, auto done) {
                           impl_->sparse_stubs_[c.shard]->async()->SparsePushPull(
                               &c.context, &c.request, &c.response, std::move(done));
                         }));
  result->indices.clear();
  result->values.clear();
  for (const auto& call : calls) {
    const std::string& indices = call->response.indices();
    const std::string& values = call->response.values();
    impl_->total_.AddReply(call->response.ByteSizeLong());
    impl_->sparse_.AddReply(call->response.ByteSizeLong());
    if (indices.size() % 4 != 0 || indices.size() != values.size()) {
      return absl::DataLossError(absl::StrCat("shard ", call->shard, " answered sparse step ", step,
                                              " with ", indices.size(), " index bytes and ",
                                              values.size(), " value bytes"));
    }
    const size_t n = indices.size() / 4;
    const size_t at = result->indices.size();
    result->indices.resize(at + n);
    result->values.resize(at + n);
    if (n > 0) {
      std::memcpy(result->indices.data() + at, indices.data(), indices.size());
      std::memcpy(result->values.data() + at, values.data(), values.size());
    }
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

}  // namespace cserps
