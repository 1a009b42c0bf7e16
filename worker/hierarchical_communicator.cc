#include "worker/hierarchical_communicator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grbs.h"
#include "common/status.h"

namespace cserps {
namespace {

// A StartAverage that failed before anything was started.
class FailedAverage final : public PendingAverage {
 public:
  explicit FailedAverage(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

std::vector<uint32_t> GroupShards(uint32_t num_shards, uint32_t local_size,
                                  uint32_t local_rank) {
  std::vector<uint32_t> shards;
  for (uint32_t s = local_rank; s < num_shards; s += local_size) shards.push_back(s);
  return shards;
}

// The selected floats of every shard, in one buffer ordered by owner (local
// rank s mod L) and then by shard, so that each owner's floats are one
// contiguous range; the summed weight follows them.
class HierarchicalCommunicator::Pending final : public PendingAverage {
 public:
  struct Part {
    uint32_t shard = 0;
    ShardPayload payload;
    uint64_t offset = 0;  // in sums_
  };

  Pending(HierarchicalCommunicator* comm, std::string what, std::vector<Part> parts,
          std::vector<uint64_t> owner_begin, absl::Span<float> mean)
      : comm_(comm),
        what_(std::move(what)),
        parts_(std::move(parts)),
        owner_begin_(std::move(owner_begin)),
        sums_(owner_begin_.back() + 1),
        mean_(mean) {}

  ~Pending() override {
    if (!waited_) Wait().IgnoreError();
    servers_.reset();  // before its `mean`, scratch_, goes back to the pool
    if (!scratch_.empty()) comm_->ReturnScratch(std::move(scratch_));
  }

  // Local sum, then this rank's shards to the servers.
  absl::Status Start(v1::Stream stream, uint64_t step, uint32_t ratio,
                     absl::Span<const float> values, float weight, float lr) {
    LocalGroup& group = *comm_->group_;
    for (const Part& part : parts_) {
      const absl::Span<float> out =
          absl::MakeSpan(sums_).subspan(part.offset, part.payload.size());
      part.payload.Gather(values, 0, out);
      for (float& v : out) v *= weight;
    }
    sums_.back() = weight;
    RETURN_IF_ERROR(group.AllReduceSum(absl::MakeSpan(sums_)));
    const float node_weight = sums_.back();
    const uint32_t me = group.local_rank();
    if (owner_begin_[me + 1] == owner_begin_[me]) return absl::OkStatus();
    scratch_ = comm_->TakeScratch();
    for (uint64_t i = owner_begin_[me]; i < owner_begin_[me + 1]; ++i) {
      sums_[i] /= node_weight;
    }
    for (const Part& part : parts_) {
      if (part.shard % group.size() != me) continue;
      part.payload.Scatter(absl::MakeConstSpan(sums_).subspan(part.offset, part.payload.size()),
                           0, absl::MakeSpan(scratch_));
    }
    servers_ = comm_->servers_->StartAverage(stream, step, ratio, scratch_, node_weight, lr,
                                             absl::MakeSpan(scratch_));
    return absl::OkStatus();
  }

  void Fail(absl::Status status) { start_status_ = std::move(status); }

  absl::Status Wait() override {
    waited_ = true;
    RETURN_IF_ERROR(start_status_);
    LocalGroup& group = *comm_->group_;
    const uint32_t me = group.local_rank();
    absl::Status mine;
    if (servers_ != nullptr) {
      mine = servers_->Wait();
      if (!mine.ok()) {
        std::vector<uint32_t> shards;
        for (const Part& part : parts_) {
          if (part.shard % group.size() == me) shards.push_back(part.shard);
        }
        mine = absl::Status(mine.code(),
                            absl::StrCat(what_, " on local rank ", me, " (shards ",
                                         absl::StrJoin(shards, ", "), "): ", mine.message()));
      }
    }
    if (mine.ok()) {
      for (const Part& part : parts_) {
        if (part.shard % group.size() != me) continue;
        part.payload.Gather(scratch_, 0,
                            absl::MakeSpan(sums_).subspan(part.offset, part.payload.size()));
      }
    }
    RETURN_IF_ERROR(ShareStatus(group, mine, what_));
    for (uint32_t owner = 0; owner < group.size(); ++owner) {
      const uint64_t begin = owner_begin_[owner];
      const uint64_t end = owner_begin_[owner + 1];
      if (end == begin) continue;
      RETURN_IF_ERROR(
          group.Broadcast(owner, absl::MakeSpan(sums_).subspan(begin, end - begin)));
    }
    for (const Part& part : parts_) {
      part.payload.Scatter(absl::MakeConstSpan(sums_).subspan(part.offset, part.payload.size()),
                           0, mean_);
    }
    return absl::OkStatus();
  }

 private:
  HierarchicalCommunicator* const comm_;
  const std::string what_;
  const std::vector<Part> parts_;
  // Owner o's floats are sums_[owner_begin_[o], owner_begin_[o + 1]).
  const std::vector<uint64_t> owner_begin_;
  std::vector<float> sums_;
  absl::Span<float> mean_;
  std::vector<float> scratch_;
  std::unique_ptr<PendingAverage> servers_;
  absl::Status start_status_;
  bool waited_ = false;
};

HierarchicalCommunicator::HierarchicalCommunicator(const v1::JobConfig& config,
                                                   uint64_t num_params,
                                                   LocalGroup* group,
                                                   Communicator* servers)
    : config_(config),
      layout_(num_params, config.algorithm().block_size(),
              static_cast<uint32_t>(config.cluster().servers_size())),
      group_(group),
      servers_(servers) {}

std::unique_ptr<PendingAverage> HierarchicalCommunicator::StartAverage(
    v1::Stream stream, uint64_t step, uint32_t ratio, absl::Span<const float> values,
    float weight, float lr, absl::Span<float> mean) {
  const std::string what = absl::StrCat("average (step ", step, ", stream ",
                                        v1::Stream_Name(stream), ", ratio ", ratio, ")");
  if (values.size() != layout_.num_params() || mean.size() != layout_.num_params()) {
    return std::make_unique<FailedAverage>(absl::InvalidArgumentError(absl::StrCat(
        what, ": values has ", values.size(), " floats and mean ", mean.size(),
        "; the model has ", layout_.num_params())));
  }
  std::vector<uint64_t> blocks;
  if (ratio != 1) {
    blocks = SelectBlocks(config_.seed(), stream, step, ratio, layout_.num_blocks());
  }
  const uint32_t local_size = group_->size();
  std::vector<Pending::Part> parts;
  std::vector<uint64_t> owner_begin;
  uint64_t offset = 0;
  for (uint32_t owner = 0; owner < local_size; ++owner) {
    owner_begin.push_back(offset);
    for (uint32_t s : GroupShards(layout_.num_shards(), local_size, owner)) {
      Pending::Part part{s,
                         ratio == 1 ? ShardPayload::AllBlocks(layout_, s)
                                    : ShardPayload::SelectedBlocks(layout_, s, blocks),
                         offset};
      offset += part.payload.size();
      parts.push_back(std::move(part));
    }
  }
  owner_begin.push_back(offset);
  auto pending = std::make_unique<Pending>(this, what, std::move(parts),
                                           std::move(owner_begin), mean);
  const absl::Status started = pending->Start(stream, step, ratio, values, weight, lr);
  if (!started.ok()) pending->Fail(started);
  return pending;
}

std::vector<float> HierarchicalCommunicator::TakeScratch() {
  {
    absl::MutexLock lock(&mu_);
    if (!spare_scratch_.empty()) {
      std::vector<float> scratch = std::move(spare_scratch_.back());
      spare_scratch_.pop_back();
      return scratch;
    }
  }
  return std::vector<float>(layout_.num_params());
}

void HierarchicalCommunicator::ReturnScratch(std::vector<float> scratch) {
  absl::MutexLock lock(&mu_);
  spare_scratch_.push_back(std::move(scratch));
}

absl::StatusOr<uint32_t> RegisterNode(LocalGroup& group, PsClient& client,
                                      int requested_rank, const std::string& node_id) {
  const std::string what = absl::StrCat("RegisterNode of \"", node_id, "\"");
  // Local rank 0 owns shard 0, which assigns the rank; the others then ask
  // for that rank, so every shard knows the node under one rank.
  absl::StatusOr<uint32_t> rank = absl::UnknownError("not registered yet");
  if (group.local_rank() == 0) rank = client.Register(requested_rank, node_id);
  RETURN_IF_ERROR(ShareStatus(group, group.local_rank() == 0 ? rank.status()
                                                             : absl::OkStatus(),
                              what));
  // A rank fits a float exactly: ranks are below 2^24 in any real job.
  float shared = group.local_rank() == 0 ? static_cast<float>(*rank) : 0.0f;
  RETURN_IF_ERROR(group.Broadcast(0, absl::MakeSpan(&shared, 1)));
  if (group.local_rank() != 0) {
    rank = client.Register(static_cast<int>(shared), node_id);
    if (rank.ok() && *rank != static_cast<uint32_t>(shared)) {
      rank = absl::InternalError(absl::StrCat(what, ": local rank ", group.local_rank(),
                                              " was registered as rank ", *rank,
                                              ", local rank 0 as ", shared));
    }
  }
  RETURN_IF_ERROR(ShareStatus(group, rank.status(), what));
  return *rank;
}

absl::Status PushNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<const float> model) {
  std::vector<float> copy(model.size());
  if (group.local_rank() == 0) std::copy(model.begin(), model.end(), copy.begin());
  RETURN_IF_ERROR(group.Broadcast(0, absl::MakeSpan(copy)));
  return ShareStatus(group, client.PushModel(copy), "PushNodeModel");
}

absl::Status PullNodeModel(LocalGroup& group, PsClient& client,
                           absl::Span<float> model, bool wait_for_init) {
  RETURN_IF_ERROR(ShareStatus(group, client.PullModel(model, wait_for_init),
                              "PullNodeModel"));
  const BlockLayout& layout = client.layout();
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    if (layout.ShardSize(s) == 0) continue;
    RETURN_IF_ERROR(group.Broadcast(
        s % group.size(), model.subspan(layout.ShardFirstFloat(s), layout.ShardSize(s))));
  }
  return absl::OkStatus();
}

}  // namespace cserps
