#include "server/async_service.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "common/direction.h"
#include "common/float_bytes.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "server/buffer_pool.h"
#include "server/unary_reply.h"

namespace cserps {
namespace {

// 2^62 - 1: no run takes as many steps, and the staleness gate's signed
// sums of a step and the bound cannot overflow.
constexpr uint64_t kMaxAsyncStep = (uint64_t{1} << 62) - 1;

std::string Describe(const AsyncService::PushHead& head) {
  return absl::StrCat("AsyncPushPull (step ", head.step, ", offset ", head.offset,
                      ") from rank ", head.rank);
}

AsyncService::PushHead HeadOf(const v1::AsyncPushPullRequest& request) {
  return {request.fingerprint(), request.rank(),   request.step(),
          request.lr(),          request.offset(), request.gradient().size() / sizeof(float)};
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
      gate_(StalenessGate::Options{
          .world_size = shard->config().cluster().num_workers(),
          .staleness = shard->config().algorithm().staleness(),
          .silence_timeout = absl::Seconds(shard->config().cluster().round_timeout_s()),
      }) {
  if (async_job_ && UsesMomentum(shard_.config().optimizer().momentum_kind())) {
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

absl::Status AsyncService::Admit(const PushHead& head, absl::Time arrived) {
  RETURN_IF_ERROR(shard_.Admit(head.fingerprint, head.rank, arrived));
  RETURN_IF_ERROR(Validate(head));
  {
    absl::MutexLock lock(&update_mu_);
    RETURN_IF_ERROR(CheckNotReusedLocked(head));
  }
  return shard_.activity().CallStarted(head.rank, arrived);
}

absl::Status AsyncService::CheckNotReusedLocked(const PushHead& head) const {
  const auto applied = applied_.find(std::make_pair(head.rank, head.offset));
  if (applied == applied_.end() || head.step >= applied->second) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", head.step, " is older than step ", applied->second, ", applied already for rank ",
      head.rank, " at offset ", head.offset,
      ": a worker restarted from an earlier state must not use its rank's steps again"));
}

absl::Status AsyncService::Validate(const PushHead& head) const {
  if (!async_job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "algorithm ", shard_.config().algorithm().name(),
        " does not push asynchronously (only async-sgd does)"));
  }
  if (!std::isfinite(head.lr) || head.lr < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lr ", head.lr, " must be finite and >= 0"));
  }
  // The staleness gate counts steps signed, and adds the bound to them.
  if (head.step > kMaxAsyncStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", head.step, " is beyond any run's: at most ", kMaxAsyncStep));
  }
  if (head.count == 0) return absl::InvalidArgumentError("gradient is empty");
  if (head.count > shard_.chunk_floats()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", head.count, " floats exceeds the chunk limit of ",
        shard_.chunk_floats(), " (cluster.max_message_bytes)"));
  }
  const ShardStore& store = shard_.store();
  const uint64_t first = store.first_float();
  const uint64_t end = first + store.size();
  if (head.offset < first || head.offset >= end || head.count > end - head.offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "floats [", head.offset, ", ", head.offset + head.count, ") are not inside shard ",
        shard_.shard(), "'s [", first, ", ", end, ")"));
  }
  // PushModel's cut: retries are told apart by (rank, offset), so pushes
  // must not overlap, and a cut of a client's own would grow that record
  // without bound.
  const uint64_t chunk = shard_.chunk_floats();
  if ((head.offset - first) % chunk != 0 || head.count != std::min(chunk, end - head.offset)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "floats [", head.offset, ", ", head.offset + head.count, ") are not one of shard ",
        shard_.shard(), "'s chunks, which start at ", first, " + i x ", chunk,
        " and run to the next or to the shard's end, ", end));
  }
  if (!store.initialised()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_.shard(),
        " has no model yet: rank 0 initialises it with PushModel"));
  }
  return absl::OkStatus();
}

void AsyncService::PassGate(const PushHead& head, absl::Time arrived,
                            std::function<absl::StatusOr<uint64_t>()> apply,
                            std::function<void(absl::Status)> finish) {
  auto answer = [this, head, apply = std::move(apply),
                 finish = std::move(finish)](const absl::Status& released) {
    absl::StatusOr<uint64_t> reply_bytes =
        released.ok() ? apply() : absl::StatusOr<uint64_t>(released);
    if (reply_bytes.ok()) {
      traffic_.handled.AddReply(*reply_bytes);
    } else {
      pushes_failed_.fetch_add(1, std::memory_order_relaxed);
    }
    shard_.activity().CallEnded(head.rank, options_.now());
    finish(Prefixed(Describe(head), reply_bytes.status()));
  };
  // The gate let its first arrival through; since then a rank the gate had
  // given up on may have come back far behind.
  if (Applied(head)) {
    answer(absl::OkStatus());
    return;
  }
  gate_.Arrive(head.rank, head.step, arrived, std::move(answer));
}

bool AsyncService::Applied(const PushHead& head) {
  absl::MutexLock lock(&update_mu_);
  const auto applied = applied_.find(std::make_pair(head.rank, head.offset));
  return applied != applied_.end() && head.step == applied->second;
}

absl::Status AsyncService::Apply(const PushHead& head, absl::Span<float> g,
                                 absl::FunctionRef<absl::Status()> read) {
  ShardStore& store = shard_.store();
  absl::MutexLock lock(&update_mu_);
  const auto key = std::make_pair(head.rank, head.offset);
  // Two pushes of one rank and offset may pass Admit before either lands.
  RETURN_IF_ERROR(CheckNotReusedLocked(head));
  auto applied = applied_.find(key);
  if (applied == applied_.end() || head.step > applied->second) {
    // p = Direction(g) at x, in place of g, with the servers' momentum;
    // then the GRAD rule of the store: x -= lr * p.
    float* m = momentum_.empty() ? nullptr : momentum_.data() + (head.offset - store.first_float());
    RETURN_IF_ERROR(store.Step(head.offset, head.lr, g, [&](const float* x, absl::Span<float> p) {
      ComputeDirection(MakeDirectionRule(shard_.config().optimizer()), p.size(), p.data(), x, m,
                       p.data());
    }));
    applied_[key] = head.step;
    pushes_applied_.fetch_add(1, std::memory_order_relaxed);
    if (head.step > newest_step_.load(std::memory_order_relaxed)) {
      newest_step_.store(head.step, std::memory_order_relaxed);
    }
  }
  return read();
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
  const PushHead head = HeadOf(*request);
  valid = CheckFloatBytes(request->gradient(), "gradient");
  if (valid.ok()) valid = Admit(head, arrived);
  if (!valid.ok()) {
    traffic_.refused.AddRequest(request->ByteSizeLong());
    reactor->Finish(ToGrpcStatus(shard_.Refusal(Prefixed(Describe(head), valid))));
    return reactor;
  }
  traffic_.handled.AddRequest(request->ByteSizeLong());
  PassGate(
      head, arrived,
      [this, head, request, response]() -> absl::StatusOr<uint64_t> {
        std::vector<float> g(head.count);
        RETURN_IF_ERROR(BytesToFloats(request->gradient(), absl::MakeSpan(g), "gradient"));
        response->set_step(head.step);
        response->set_offset(head.offset);
        RETURN_IF_ERROR(Apply(head, absl::MakeSpan(g), [&] {
          return shard_.store().Read(head.offset, head.count, response->mutable_model());
        }));
        return response->ByteSizeLong();
      },
      [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

void AsyncService::Push(const PushHead& head, std::shared_ptr<float[]> gradient,
                        uint64_t request_bytes, uint64_t reply_overhead, ModelReply done) {
  const absl::Time arrived = options_.now();
  absl::Status valid = Admit(head, arrived);
  if (!valid.ok()) {
    traffic_.refused.AddRequest(request_bytes);
    done(shard_.Refusal(Prefixed(Describe(head), valid)));
    return;
  }
  traffic_.handled.AddRequest(request_bytes);
  auto model = FloatPool::Shared().Get(head.count);
  PassGate(
      head, arrived,
      [this, head, gradient = std::move(gradient), model,
       reply_overhead]() -> absl::StatusOr<uint64_t> {
        RETURN_IF_ERROR(Apply(head, absl::MakeSpan(gradient.get(), head.count), [&] {
          return shard_.store().Read(head.offset, absl::MakeSpan(*model));
        }));
        return reply_overhead + head.count * sizeof(float);
      },
      [model, done = std::move(done)](const absl::Status& status) {
        if (status.ok()) {
          done(RoundMean(model));
        } else {
          done(status);
        }
      });
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
