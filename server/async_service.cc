#include "server/async_service.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/direction.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "server/unary_reply.h"

namespace cserps {
namespace {

std::string Describe(const v1::AsyncPushPullRequest& request) {
  return absl::StrCat("AsyncPushPull (step ", request.step(), ", offset ",
                      request.offset(), ") from rank ", request.rank());
}

bool IsAsyncJob(const v1::JobConfig& config) {
  absl::StatusOr<AlgorithmInfo> info = FindAlgorithm(config.algorithm().name());
  return info.ok() && info->exchange == Exchange::kAsync;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AsyncService>> AsyncService::Create(ShardContext* shard,
                                                                   Options options) {
  if (!options.now) options.now = RealNow;
  return std::unique_ptr<AsyncService>(new AsyncService(shard, std::move(options)));
}

AsyncService::AsyncService(ShardContext* shard, Options options)
    : shard_(*shard),
      options_(std::move(options)),
      async_job_(IsAsyncJob(shard->config())),
      all_blocks_(ShardPayload::AllBlocks(shard->layout(), shard->shard())),
      gate_(StalenessGate::Options{
          .world_size = shard->config().cluster().num_workers(),
          .staleness = shard->config().algorithm().staleness(),
          .silence_timeout = absl::Seconds(shard->config().cluster().round_timeout_s()),
      }) {
  const auto kind = shard_.config().optimizer().momentum_kind();
  if (kind == v1::OptimizerConfig::HEAVY_BALL || kind == v1::OptimizerConfig::NESTEROV) {
    absl::MutexLock lock(&update_mu_);
    momentum_.assign(shard_.store().size(), 0.0f);
  }
  if (options_.expiry_thread) {
    // A rank is declared dead at most a quarter of its timeout late.
    const absl::Duration period = std::clamp(
        absl::Seconds(shard_.config().cluster().round_timeout_s()) / 4,
        absl::Milliseconds(10), absl::Seconds(1));
    expiry_ = std::make_unique<ExpiryThread>(
        options_.now, [] { return absl::InfiniteFuture(); },
        [this](absl::Time now) { gate_.ExpireSilentRanks(now); }, period);
  }
}

AsyncService::~AsyncService() { Shutdown(); }

void AsyncService::Shutdown() {
  if (shut_down_.exchange(true)) return;
  gate_.FailAll(absl::UnavailableError(
      absl::StrCat("server shard ", shard_.shard(), " is shutting down")));
}

absl::Status AsyncService::Validate(const v1::AsyncPushPullRequest& request) const {
  if (!async_job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "algorithm ", shard_.config().algorithm().name(),
        " does not push asynchronously (only async-sgd does)"));
  }
  if (!std::isfinite(request.lr()) || request.lr() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr ", request.lr(), " must be finite and >= 0"));
  }
  RETURN_IF_ERROR(CheckFloatBytes(request.gradient(), "gradient"));
  const uint64_t count = request.gradient().size() / sizeof(float);
  if (count == 0) return absl::InvalidArgumentError("gradient is empty");
  if (count > shard_.chunk_floats()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", count, " floats exceeds the chunk limit of ",
        shard_.chunk_floats(), " (cluster.max_message_bytes)"));
  }
  const ShardStore& store = shard_.store();
  const uint64_t first = store.first_float();
  const uint64_t end = first + store.size();
  if (request.offset() < first || request.offset() >= end ||
      count > end - request.offset()) {
    return absl::OutOfRangeError(absl::StrCat(
        "floats [", request.offset(), ", ", request.offset() + count,
        ") are not inside shard ", shard_.shard(), "'s [", first, ", ", end, ")"));
  }
  if (!store.initialised()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_.shard(),
        " has no model yet: rank 0 initialises it with PushModel"));
  }
  return absl::OkStatus();
}

absl::Status AsyncService::Apply(const v1::AsyncPushPullRequest& request,
                                 v1::AsyncPushPullResponse* response) {
  ShardStore& store = shard_.store();
  const uint64_t offset = request.offset();
  const uint64_t count = request.gradient().size() / sizeof(float);
  response->set_step(request.step());
  response->set_offset(offset);
  absl::MutexLock lock(&update_mu_);
  const auto key = std::make_pair(request.rank(), offset);
  auto applied = applied_.find(key);
  if (applied == applied_.end() || request.step() > applied->second) {
    std::vector<float> g(count);
    RETURN_IF_ERROR(BytesToFloats(request.gradient(), absl::MakeSpan(g), "gradient"));
    std::vector<float> x(count);
    RETURN_IF_ERROR(store.Read(offset, absl::MakeSpan(x)));
    // p = Direction(g) at x, in place of g, with the servers' momentum.
    float* m = momentum_.empty() ? nullptr : momentum_.data() + (offset - store.first_float());
    ComputeDirection(MakeDirectionRule(shard_.config().optimizer()), count, g.data(),
                     x.data(), m, g.data());
    // GRAD rule of the store: x -= lr * p.
    store.ApplyMean(/*is_model_stream=*/false, all_blocks_,
                    offset - store.first_float(), g, request.lr());
    applied_[key] = request.step();
    pushes_applied_.fetch_add(1, std::memory_order_relaxed);
    if (request.step() > newest_step_.load(std::memory_order_relaxed)) {
      newest_step_.store(request.step(), std::memory_order_relaxed);
    }
  }
  return store.Read(offset, count, response->mutable_model());
}

grpc::ServerUnaryReactor* AsyncService::AsyncPushPull(
    grpc::CallbackServerContext* context, const v1::AsyncPushPullRequest* request,
    v1::AsyncPushPullResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time arrived = options_.now();
  absl::Status valid = shard_.Authenticate(*context);
  if (!valid.ok()) {
    reactor->Finish(ToGrpcStatus(Prefixed("AsyncPushPull", valid)));
    return reactor;
  }
  valid = shard_.Admit(request->fingerprint(), request->rank(), arrived);
  if (valid.ok()) valid = Validate(*request);
  if (valid.ok()) valid = shard_.activity().CallStarted(request->rank(), arrived);
  if (!valid.ok()) {
    traffic_.refused.AddRequest(request->ByteSizeLong());
    reactor->Finish(ToGrpcStatus(shard_.Refusal(Prefixed(Describe(*request), valid))));
    return reactor;
  }
  traffic_.handled.AddRequest(request->ByteSizeLong());
  gate_.Arrive(request->rank(), request->step(), arrived,
               [this, reactor, request, response](absl::Status status) {
                 if (status.ok()) status = Apply(*request, response);
                 if (status.ok()) {
                   traffic_.handled.AddReply(response->ByteSizeLong());
                 } else {
                   pushes_failed_.fetch_add(1, std::memory_order_relaxed);
                 }
                 shard_.activity().CallEnded(request->rank(), options_.now());
                 reactor->Finish(ToGrpcStatus(Prefixed(Describe(*request), status)));
               });
  return reactor;
}

AsyncService::Counters AsyncService::counters() const {
  Counters c;
  c.pushes_applied = pushes_applied_.load(std::memory_order_relaxed);
  c.pushes_failed = pushes_failed_.load(std::memory_order_relaxed);
  c.newest_step = newest_step_.load(std::memory_order_relaxed);
  c.traffic = traffic_.handled.Snapshot();
  c.refused = traffic_.refused.Snapshot();
  return c;
}

}  // namespace cserps
