#include "worker/ps/push_pull_round.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bulk_wire.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/ps/call_batch.h"

namespace cserps {
namespace {

struct PushPullCall {
  std::unique_ptr<grpc::ClientContext> context;  // of the current attempt
  v1::PushPullRequest request;
  v1::PushPullResponse response;
  absl::Status status;  // of the last attempt
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
      }
      if (state.batch != nullptr) state.batch->Wait().IgnoreError();
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
      state.shard = source.shard;
      state.payload = source.payload;
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
    // Started once the shard's calls are complete: callbacks may run at once.
    for (const ShardSource& source : sources) IssueGrpc(*shard_state_[source.shard]);
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
    if (state.channel != nullptr) RETURN_IF_ERROR(WaitBulk(state));
    RETURN_IF_ERROR(WaitGrpc(state));
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
      NoteMembers(state.shard, call->response.members());
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
    uint32_t shard = 0;
    uint64_t size = 0;
    bool started = false;
    bool waited = false;
    absl::Time deadline;
    absl::Time attempt_deadline;  // gRPC: of the current attempt
    PayloadSpans payload;
    MeanSpans mean;
    // gRPC: the calls (also the bulk chunks sent again), those of the
    // current attempt and its batch
    std::vector<std::unique_ptr<PushPullCall>> calls;
    std::vector<PushPullCall*> pending;
    std::unique_ptr<CallBatch> batch;
    // bulk: the channel, the requests sent (their chunk, offset, floats),
    // the first error
    std::shared_ptr<BulkChannel> channel;
    std::vector<uint64_t> bulk_ids;
    std::vector<uint32_t> bulk_chunks;
    std::vector<uint64_t> bulk_begins;
    std::vector<uint64_t> bulk_counts;
    absl::Status bulk_error;
  };

  // Sends state.pending over gRPC, each call with a context of its own.
  void IssueGrpc(ShardState& state) {
    if (state.pending.empty()) return;
    state.batch = std::make_unique<CallBatch>();
    CallBatch* batch = state.batch.get();
    state.attempt_deadline = AttemptDeadline(state.deadline, setup_.attempt_timeout);
    const std::string context = absl::StrCat("PushPull to shard ", state.shard, " at ",
                                             (*setup_.addresses)[state.shard]);
    for (PushPullCall* call : state.pending) {
      call->context = std::make_unique<grpc::ClientContext>();
      SetDeadline(call->context.get(), state.attempt_deadline - absl::Now());
      batch->Add();
      (*setup_.stubs)[state.shard]->async()->PushPull(
          call->context.get(), &call->request, &call->response,
          [batch, call, context](grpc::Status status) {
            call->status = FromGrpcStatus(status, context);
            batch->Done(call->status);
          });
    }
  }

  // Waits for the pending calls, sending those that lost their connection
  // or outlived their attempt again after a backoff while the deadline
  // allows.
  absl::Status WaitGrpc(ShardState& state) {
    Backoff backoff(state.deadline);
    while (!state.pending.empty()) {
      if (TimedWait(*state.batch, setup_.waited_nanos).ok()) break;
      std::vector<PushPullCall*> again;
      for (PushPullCall* call : state.pending) {
        if (call->status.ok()) continue;
        if (!RetryableAttempt(call->status, state.attempt_deadline, state.deadline)) {
          return call->status;
        }
        again.push_back(call);
      }
      if (!backoff.Wait()) return backoff.Exhausted(again.front()->status);
      setup_.retries->fetch_add(again.size());
      spdlog::warn("{}; sending {} chunk(s) of step {} again (retry {})",
                   std::string(again.front()->status.message()), again.size(), setup_.step,
                   backoff.retries());
      state.pending = std::move(again);
      IssueGrpc(state);
    }
    state.pending.clear();
    return absl::OkStatus();
  }

  // A retry's bytes are traffic, its floats were counted the first time.
  void AddGrpcCall(ShardState& state, uint32_t shard, uint32_t chunk, uint64_t begin,
                   uint64_t count, absl::Span<const absl::Span<const float>> values,
                   bool retry = false) {
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
    setup_.traffic->AddRequest(request.ByteSizeLong(), retry ? 0 : count);
    state.pending.push_back(call.get());
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
    state.bulk_chunks.push_back(chunk);
    state.bulk_begins.push_back(begin);
    state.bulk_counts.push_back(count);
  }

  // Waits for the bulk replies; the chunks whose channel broke (and those
  // it could not send) go out again over gRPC, for WaitGrpc.
  absl::Status WaitBulk(ShardState& state) {
    const absl::Time start = absl::Now();
    absl::Status status;
    std::vector<size_t> lost;
    for (size_t i = 0; i < state.bulk_ids.size(); ++i) {
      absl::Status one = state.channel->Wait(state.bulk_ids[i], state.deadline);
      if (one.ok()) {
        const uint64_t bytes = bulk::Reply::kBytes + state.bulk_counts[i] * sizeof(float);
        setup_.total->AddReply(bytes);
        setup_.traffic->AddReply(bytes);
      } else if (Retryable(one)) {
        lost.push_back(i);
        if (status.ok()) status = std::move(one);
      } else {
        // The later chunks' replies would land in the caller's mean after
        // it has taken it back, and the channel outlives the round.
        for (size_t j = i + 1; j < state.bulk_ids.size(); ++j) {
          state.channel->Wait(state.bulk_ids[j], state.deadline).IgnoreError();
        }
        return one;
      }
    }
    setup_.waited_nanos->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start));
    NoteMembers(state.shard, state.channel->members());
    // Chunks never sent: the channel broke before them.
    uint64_t sent = 0;
    for (uint64_t count : state.bulk_counts) sent += count;
    if (!state.bulk_error.ok() && !Retryable(state.bulk_error)) return state.bulk_error;
    if (lost.empty() && sent == state.size) return absl::OkStatus();
    spdlog::warn("{}; sending the shard's unanswered chunks of step {} over gRPC",
                 std::string((status.ok() ? state.bulk_error : status).message()), setup_.step);
    std::vector<absl::Span<const float>> values;
    // A chunk never sent is a first send: its floats count here.
    auto send = [&](uint32_t chunk, uint64_t begin, uint64_t count, bool retry) {
      values.clear();
      state.payload(begin, count, &values);
      AddGrpcCall(state, state.shard, chunk, begin, count, values, retry);
      if (retry) setup_.retries->fetch_add(1);
    };
    for (size_t i : lost) {
      send(state.bulk_chunks[i], state.bulk_begins[i], state.bulk_counts[i], /*retry=*/true);
    }
    for (uint64_t begin = sent; begin < state.size; begin += setup_.chunk_floats) {
      send(static_cast<uint32_t>(begin / setup_.chunk_floats), begin,
           std::min(setup_.chunk_floats, state.size - begin), /*retry=*/false);
    }
    IssueGrpc(state);
    return absl::OkStatus();
  }

  void NoteMembers(uint32_t shard, uint32_t members) {
    if (members != 0) setup_.members[shard].store(members);
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

std::unique_ptr<ShardedAverage> MakePushPullRound(RoundSetup setup,
                                                  std::vector<uint64_t> payload_sizes) {
  return std::make_unique<PushPullRound>(std::move(setup), std::move(payload_sizes));
}

absl::Status RunHostSpanRound(RoundSetup setup, std::vector<ShardPayload> payloads,
                              absl::Span<const float> values, absl::Span<float> mean) {
  HostSpanRound round(std::move(setup), std::move(payloads), mean);
  round.Start(values);
  return round.Wait();
}

}  // namespace cserps
