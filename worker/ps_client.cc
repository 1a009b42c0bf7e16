#include "worker/ps_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/algorithm_catalog.h"
#include "common/config.h"
#include "common/float_bytes.h"
#include "common/grbs.h"
#include "common/grpc_status.h"
#include "common/status.h"

namespace cserps {
namespace {

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

class PendingPushPull final : public PendingAverage {
 public:
  PendingPushPull(std::vector<ShardPayload> payloads, absl::Span<float> mean,
                  std::atomic<uint64_t>* bytes_pulled,
                  std::atomic<uint64_t>* stream_bytes_pulled,
                  std::atomic<int64_t>* waited)
      : payloads_(std::move(payloads)),
        mean_(mean),
        bytes_pulled_(bytes_pulled),
        stream_bytes_pulled_(stream_bytes_pulled),
        waited_nanos_(waited) {}
  ~PendingPushPull() override {
    if (!waited_) batch_.Wait().IgnoreError();
  }

  const ShardPayload& payload(uint32_t shard) const { return payloads_[shard]; }
  CallBatch& batch() { return batch_; }
  std::vector<std::unique_ptr<PushPullCall>>& calls() { return calls_; }

  absl::Status Wait() override {
    waited_ = true;
    RETURN_IF_ERROR(TimedWait(batch_, waited_nanos_));
    for (const auto& call : calls_) {
      const std::string& bytes = call->response.mean();
      if (bytes.size() != call->count * sizeof(float)) {
        return absl::DataLossError(absl::StrCat(
            "shard ", call->shard, " answered step ", call->request.step(),
            " chunk ", call->request.chunk(), " with ", bytes.size(),
            " bytes; expected ", call->count * sizeof(float)));
      }
      bytes_pulled_->fetch_add(call->response.ByteSizeLong());
      stream_bytes_pulled_->fetch_add(call->response.ByteSizeLong());
      payloads_[call->shard].ForEachPiece(
          call->begin, call->count, [&](uint64_t m, uint64_t p, uint64_t n) {
            std::memcpy(mean_.data() + m,
                        bytes.data() + (p - call->begin) * sizeof(float),
                        n * sizeof(float));
          });
    }
    return absl::OkStatus();
  }

 private:
  const std::vector<ShardPayload> payloads_;
  absl::Span<float> mean_;
  std::atomic<uint64_t>* bytes_pulled_;
  std::atomic<uint64_t>* stream_bytes_pulled_;
  std::atomic<int64_t>* waited_nanos_;
  CallBatch batch_;
  std::vector<std::unique_ptr<PushPullCall>> calls_;
  bool waited_ = false;
};

}  // namespace

PsClient::PsClient(const v1::JobConfig& config, uint64_t num_params,
                   PsClientOptions options)
    : config_(config),
      options_(options),
      layout_(num_params, config.algorithm().block_size(),
              config.cluster().servers_size()),
      chunk_floats_(ChunkFloats(config.cluster().max_message_bytes())),
      fingerprint_(JobFingerprint(config)) {}

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
  std::unique_ptr<PsClient> client(new PsClient(config, num_params, options));
  for (const std::string& address : config.cluster().servers()) {
    const uint32_t shard = static_cast<uint32_t>(client->addresses_.size());
    client->addresses_.push_back(address);
    if (!client->TalksTo(shard)) {
      client->stubs_.push_back(nullptr);
      client->async_stubs_.push_back(nullptr);
      client->sparse_stubs_.push_back(nullptr);
      continue;
    }
    client->shards_.push_back(shard);
    grpc::ChannelArguments args;
    const int max_bytes = static_cast<int>(config.cluster().max_message_bytes());
    args.SetMaxReceiveMessageSize(max_bytes);
    args.SetMaxSendMessageSize(max_bytes);
    args.SetInt("grpc.per_rpc_retry_buffer_size", max_bytes);
    args.SetServiceConfigJSON(kServiceConfig);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    client->stubs_.push_back(v1::ParameterServer::NewStub(channel));
    client->async_stubs_.push_back(v1::AsyncParameterServer::NewStub(channel));
    client->sparse_stubs_.push_back(v1::SparseExchange::NewStub(channel));
  }
  return client;
}

absl::StatusOr<uint32_t> PsClient::Register(int requested_rank,
                                            const std::string& worker_id) {
  if (shards_.empty() && requested_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Register: this client talks to no shard (shard_offset ", options_.shard_offset,
        " of stride ", options_.shard_stride, ", ", addresses_.size(),
        " shards), so it must be given its rank"));
  }
  int rank = requested_rank;
  for (uint32_t s : shards_) {
    v1::RegisterRequest request;
    *request.mutable_config() = config_;
    request.set_requested_rank(rank);
    request.set_worker_id(worker_id);
    v1::RegisterResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, options_.setup_timeout);
    RETURN_IF_ERROR(FromGrpcStatus(
        stubs_[s]->Register(&context, request, &response),
        absl::StrCat("Register with shard ", s, " at ", addresses_[s])));
    if (response.model_size() != layout_.num_params() ||
        response.shard().shard() != s) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", s, " at ", addresses_[s], " reports shard ",
          response.shard().shard(), " with a model of ", response.model_size(),
          " floats; this worker expects shard ", s, " of a model of ",
          layout_.num_params(), " floats: check the order of cluster.servers"));
    }
    rank = static_cast<int>(response.rank());
  }
  rank_ = static_cast<uint32_t>(rank);
  return rank_;
}

std::vector<PsClient::ModelChunk> PsClient::ModelChunks() const {
  std::vector<ModelChunk> chunks;
  for (uint32_t s : shards_) {
    for (uint64_t off = layout_.ShardFirstFloat(s); off < layout_.ShardEndFloat(s);
         off += chunk_floats_) {
      chunks.push_back({s, off, std::min(chunk_floats_, layout_.ShardEndFloat(s) - off)});
    }
  }
  return chunks;
}

PsClient::StreamTraffic PsClient::traffic(v1::Stream stream) const {
  const StreamCounters& c = streams_[stream];
  return {c.bytes_pushed.load(), c.bytes_pulled.load(), c.floats_pushed.load()};
}

std::unique_ptr<PendingAverage> PsClient::StartAverage(
    v1::Stream stream, uint64_t step, uint32_t ratio,
    absl::Span<const float> values, float weight, float lr,
    absl::Span<float> mean) {
  std::vector<ShardPayload> payloads;
  if (ratio == 1) {
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      payloads.push_back(ShardPayload::AllBlocks(layout_, s));
    }
  } else {
    const std::vector<uint64_t> blocks = SelectBlocks(
        config_.seed(), stream, step, ratio, layout_.num_blocks());
    for (uint32_t s = 0; s < stubs_.size(); ++s) {
      payloads.push_back(ShardPayload::SelectedBlocks(layout_, s, blocks));
    }
  }
  StreamCounters& counters = streams_[stream];
  auto pending = std::make_unique<PendingPushPull>(
      std::move(payloads), mean, &bytes_pulled_, &counters.bytes_pulled, &wait_nanos_);
  for (uint32_t s : shards_) {
    const ShardPayload& payload = pending->payload(s);
    const uint32_t chunks = NumChunks(payload.size(), chunk_floats_);
    for (uint32_t c = 0; c < chunks; ++c) {
      auto call = std::make_unique<PushPullCall>();
      call->shard = s;
      call->begin = c * chunk_floats_;
      call->count = std::min(chunk_floats_, payload.size() - call->begin);
      v1::PushPullRequest& request = call->request;
      request.set_fingerprint(fingerprint_);
      request.set_rank(rank_);
      request.set_step(step);
      request.set_stream(stream);
      request.set_ratio(ratio);
      request.set_chunk(c);
      request.set_weight(weight);
      request.set_lr(lr);
      std::string* bytes = request.mutable_values();
      bytes->resize(call->count * sizeof(float));
      payload.ForEachPiece(call->begin, call->count,
                           [&](uint64_t m, uint64_t p, uint64_t n) {
                             std::memcpy(bytes->data() + (p - call->begin) * sizeof(float),
                                         values.data() + m, n * sizeof(float));
                           });
      bytes_pushed_.fetch_add(request.ByteSizeLong());
      counters.bytes_pushed.fetch_add(request.ByteSizeLong());
      counters.floats_pushed.fetch_add(call->count);
      SetDeadline(&call->context,
                  absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack);
      pending->calls().push_back(std::move(call));
    }
  }
  // Start the calls only once `calls` is complete: callbacks may run at once.
  for (auto& call : pending->calls()) {
    pending->batch().Add();
    CallBatch* batch = &pending->batch();
    const std::string context =
        absl::StrCat("PushPull to shard ", call->shard, " at ", addresses_[call->shard]);
    stubs_[call->shard]->async()->PushPull(
        &call->context, &call->request, &call->response,
        [batch, context](grpc::Status status) {
          batch->Done(FromGrpcStatus(status, context));
        });
  }
  return pending;
}

absl::Status PsClient::PushModel(absl::Span<const float> model) {
  RETURN_IF_ERROR(CheckModelSize("PushModel: model", model.size(), layout_.num_params()));
  using Call = ShardCall<v1::PushModelRequest, v1::PushModelResponse>;
  std::vector<std::unique_ptr<Call>> calls;
  for (const ModelChunk& chunk : ModelChunks()) {
    auto call = std::make_unique<Call>();
    call->shard = chunk.shard;
    call->request.set_fingerprint(fingerprint_);
    call->request.set_rank(rank_);
    call->request.set_offset(chunk.offset);
    AppendFloats(model.subspan(chunk.offset, chunk.count), call->request.mutable_values());
    bytes_pushed_.fetch_add(call->request.ByteSizeLong());
    SetDeadline(&call->context, options_.setup_timeout);
    calls.push_back(std::move(call));
  }
  return RunAll(calls, "PushModel to", addresses_, &wait_nanos_, [&](Call& c, auto done) {
    stubs_[c.shard]->async()->PushModel(&c.context, &c.request, &c.response, std::move(done));
  });
}

absl::Status PsClient::PullModel(absl::Span<float> model, bool wait_for_init) {
  RETURN_IF_ERROR(CheckModelSize("PullModel: model", model.size(), layout_.num_params()));
  using Call = ShardCall<v1::PullModelRequest, v1::PullModelResponse>;
  std::vector<std::unique_ptr<Call>> calls;
  for (const ModelChunk& chunk : ModelChunks()) {
    auto call = std::make_unique<Call>();
    call->shard = chunk.shard;
    call->request.set_fingerprint(fingerprint_);
    call->request.set_offset(chunk.offset);
    call->request.set_count(chunk.count);
    call->request.set_wait_for_init(wait_for_init);
    SetDeadline(&call->context, options_.setup_timeout);
    calls.push_back(std::move(call));
  }
  RETURN_IF_ERROR(RunAll(calls, "PullModel from", addresses_, &wait_nanos_, [&](Call& c, auto done) {
    stubs_[c.shard]->async()->PullModel(&c.context, &c.request, &c.response, std::move(done));
  }));
  for (const auto& call : calls) {
    bytes_pulled_.fetch_add(call->response.ByteSizeLong());
    RETURN_IF_ERROR(BytesToFloats(
        call->response.values(),
        model.subspan(call->request.offset(), call->request.count()),
        absl::StrCat("PullModel reply from shard ", call->shard)));
  }
  return absl::OkStatus();
}

absl::Status PsClient::AsyncPushPull(uint64_t step, float lr,
                                     absl::Span<const float> grad,
                                     absl::Span<float> model) {
  RETURN_IF_ERROR(CheckModelSize("AsyncPushPull: gradient", grad.size(), layout_.num_params()));
  RETURN_IF_ERROR(CheckModelSize("AsyncPushPull: model", model.size(), layout_.num_params()));
  using Call = ShardCall<v1::AsyncPushPullRequest, v1::AsyncPushPullResponse>;
  StreamCounters& counters = streams_[v1::GRAD];
  std::vector<std::unique_ptr<Call>> calls;
  for (const ModelChunk& chunk : ModelChunks()) {
    auto call = std::make_unique<Call>();
    call->shard = chunk.shard;
    call->count = chunk.count;
    call->request.set_fingerprint(fingerprint_);
    call->request.set_rank(rank_);
    call->request.set_step(step);
    call->request.set_lr(lr);
    call->request.set_offset(chunk.offset);
    AppendFloats(grad.subspan(chunk.offset, chunk.count), call->request.mutable_gradient());
    bytes_pushed_.fetch_add(call->request.ByteSizeLong());
    counters.bytes_pushed.fetch_add(call->request.ByteSizeLong());
    counters.floats_pushed.fetch_add(call->count);
    // A held-back push waits at most until the slowest rank is declared
    // dead, round_timeout_s after it went silent.
    SetDeadline(&call->context,
                absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack);
    calls.push_back(std::move(call));
  }
  RETURN_IF_ERROR(RunAll(calls, "AsyncPushPull to", addresses_, &wait_nanos_, [&](Call& c, auto done) {
    async_stubs_[c.shard]->async()->AsyncPushPull(&c.context, &c.request, &c.response,
                                                  std::move(done));
  }));
  for (const auto& call : calls) {
    bytes_pulled_.fetch_add(call->response.ByteSizeLong());
    counters.bytes_pulled.fetch_add(call->response.ByteSizeLong());
    RETURN_IF_ERROR(BytesToFloats(
        call->response.model(), model.subspan(call->request.offset(), call->count),
        absl::StrCat("AsyncPushPull reply from shard ", call->shard)));
  }
  return absl::OkStatus();
}

PsClient::StreamTraffic PsClient::sparse_traffic() const {
  return {sparse_.bytes_pushed.load(), sparse_.bytes_pulled.load(),
          sparse_.floats_pushed.load()};
}

absl::Status PsClient::ExchangeSparse(uint64_t step, const SparseVector& local,
                                      SparseVector* result) {
  const uint64_t d = layout_.num_params();
  if (local.indices.size() != local.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExchangeSparse: ", local.indices.size(), " indices but ",
        local.values.size(), " values"));
  }
  using Call = ShardCall<v1::SparsePushPullRequest, v1::SparsePushPullResponse>;
  const uint64_t k = SparseK(config_.algorithm(), d);
  std::vector<std::unique_ptr<Call>> calls;
  size_t pos = 0;
  for (uint32_t s = 0; s < sparse_stubs_.size(); ++s) {
    const uint64_t size = layout_.ShardSize(s);
    if (size == 0) continue;
    const size_t begin = pos;
    while (pos < local.indices.size() && local.indices[pos] < layout_.ShardEndFloat(s)) ++pos;
    if (!TalksTo(s)) continue;
    auto call = std::make_unique<Call>();
    call->shard = s;
    v1::SparsePushPullRequest& request = call->request;
    request.set_fingerprint(fingerprint_);
    request.set_rank(rank_);
    request.set_step(step);
    request.set_k(ShardSparseK(k, size, d));
    request.mutable_indices()->assign(
        reinterpret_cast<const char*>(local.indices.data() + begin),
        (pos - begin) * sizeof(uint32_t));
    request.mutable_values()->assign(
        reinterpret_cast<const char*>(local.values.data() + begin),
        (pos - begin) * sizeof(float));
    bytes_pushed_.fetch_add(request.ByteSizeLong());
    sparse_.bytes_pushed.fetch_add(request.ByteSizeLong());
    sparse_.floats_pushed.fetch_add(pos - begin);
    SetDeadline(&call->context,
                absl::Seconds(config_.cluster().round_timeout_s()) + options_.rpc_slack);
    calls.push_back(std::move(call));
  }
  if (pos != local.indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExchangeSparse: index ", local.indices[pos], " at position ", pos,
        " is not below the model size ", d, " or the indices are not ascending"));
  }
  RETURN_IF_ERROR(RunAll(calls, "SparsePushPull to", addresses_, &wait_nanos_, [&](auto& c, auto done) {
    sparse_stubs_[c.shard]->async()->SparsePushPull(&c.context, &c.request, &c.response,
                                                    std::move(done));
  }));
  result->indices.clear();
  result->values.clear();
  for (const auto& call : calls) {
    const std::string& indices = call->response.indices();
    const std::string& values = call->response.values();
    bytes_pulled_.fetch_add(call->response.ByteSizeLong());
    sparse_.bytes_pulled.fetch_add(call->response.ByteSizeLong());
    if (indices.size() % 4 != 0 || indices.size() != values.size()) {
      return absl::DataLossError(absl::StrCat(
          "shard ", call->shard, " answered sparse step ", step, " with ",
          indices.size(), " index bytes and ", values.size(), " value bytes"));
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
  if (shard >= stubs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no shard ", shard));
  }
  if (!TalksTo(shard)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetStatus: shard ", shard, " is not one this client talks to"));
  }
  grpc::ClientContext context;
  SetDeadline(&context, options_.setup_timeout);
  v1::GetStatusResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(
      stubs_[shard]->GetStatus(&context, v1::GetStatusRequest(), &response),
      absl::StrCat("GetStatus of shard ", shard, " at ", addresses_[shard])));
  return response;
}

}  // namespace cserps
