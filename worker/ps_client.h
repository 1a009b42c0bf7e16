// The worker's client of the sharded parameter server: the whole API a
// training algorithm needs to talk to the servers (ps-lite's KVWorker in
// spirit: Register, PushPull, Push/Pull of the model).
//
// Each call sends one RPC per shard and chunk, all in parallel, and returns
// when every shard has answered. UNAVAILABLE calls are retried by gRPC
// (pushes are idempotent on the server). Thread safety: one thread at a time
// per client, except that a started average may be awaited on another.
#ifndef CSERPS_WORKER_PS_CLIENT_H_
#define CSERPS_WORKER_PS_CLIENT_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "cserps/v1/async_sgd.grpc.pb.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "cserps/v1/sparse.grpc.pb.h"
#include "worker/communicator.h"

namespace cserps {

struct PsClientOptions {
  // Extra time a PushPull may take beyond the round timeout.
  absl::Duration rpc_slack = absl::Seconds(30);
  // Deadline of Register, PushModel and PullModel calls (which wait for the
  // servers to come up and for rank 0 to initialise the model).
  absl::Duration setup_timeout = absl::Seconds(120);
  // Talk only to the shards s with s % shard_stride == shard_offset: those
  // of local rank shard_offset in an intra-node group of shard_stride
  // processes (worker/hierarchical_communicator.h). Every call then covers
  // only those shards: Register registers with them alone, averages,
  // PushModel, PullModel and AsyncPushPull read and write only their
  // floats, ExchangeSparse sends and returns only their entries, GetStatus
  // refuses other shards. The defaults, 1 and 0: every shard.
  uint32_t shard_stride = 1;
  uint32_t shard_offset = 0;
};

struct RoundSetup;  // worker/ps_client.cc

// One average round whose payloads the caller gathers itself, sent and
// received shard by shard (the device path, worker/staged_average.h): shard
// s's request can go out while shard s+1's payload is still being copied.
// Given the same values it is the same round as StartAverage(stream, step,
// ratio, values, weight, lr, ...) and gives bit-identical means.
//
// Threads: one at a time. Destroying a round waits for every started shard's
// reply (the buffers given to StartShard must outlive that).
class ShardedAverage {
 public:
  virtual ~ShardedAverage() = default;
  // The shards the round sends to, ascending: those of the client's shards
  // whose payload is not empty.
  virtual const std::vector<uint32_t>& shards() const = 0;
  // Floats of `shard`'s payload: its GRBS-selected blocks, ascending,
  // concatenated (ShardPayload); 0 for a shard not in shards().
  virtual uint64_t payload_size(uint32_t shard) const = 0;
  // Sends `payload` (read before this returns) to `shard`. `mean` (as many
  // floats) must stay alive until WaitShard(shard) returns, which writes the
  // weighted mean into it; it may be the payload's buffer. INVALID_ARGUMENT
  // naming the shard and the sizes when `payload` or `mean` is not
  // payload_size(shard) floats; FAILED_PRECONDITION for a shard not in
  // shards() or already started.
  virtual absl::Status StartShard(uint32_t shard, absl::Span<const float> payload,
                                  absl::Span<float> mean) = 0;
  // Blocks until `shard`'s reply is in its `mean`. FAILED_PRECONDITION when
  // the shard was not started or was already awaited; DATA_LOSS for a reply
  // of the wrong size; the RPC's error naming the shard and its address.
  virtual absl::Status WaitShard(uint32_t shard) = 0;
};

class PsClient final : public Communicator {
 public:

  // `config` has defaults applied and is valid; `num_params` is the model's d.
  // INVALID_ARGUMENT for no servers, shard_stride 0 or shard_offset not
  // below shard_stride.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const v1::JobConfig& config, uint64_t num_params, PsClientOptions options = {});

  // Joins the job on every shard; shard 0 (the first of this client's
  // shards) assigns the rank when `requested_rank` < 0. A client with no
  // shards sends nothing and takes `requested_rank`, which must then be
  // >= 0 (INVALID_ARGUMENT otherwise). Returns the rank.
  absl::StatusOr<uint32_t> Register(int requested_rank, const std::string& worker_id);

  std::unique_ptr<PendingAverage> StartAverage(v1::Stream stream, uint64_t step,
                                               uint32_t ratio,
                                               absl::Span<const float> values,
                                               float weight, float lr,
                                               absl::Span<float> mean) override;

  // The round StartAverage(stream, step, ratio, ...) would run, with the
  // payloads left to the caller (ShardedAverage above). Sends nothing yet.
  std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream, uint64_t step,
                                                      uint32_t ratio, float weight,
                                                      float lr);

  // Writes the whole model to the servers (rank 0 initialising the job).
  absl::Status PushModel(absl::Span<const float> model);
  // Reads the whole model; with `wait_for_init`, waits until it was pushed.
  absl::Status PullModel(absl::Span<float> model, bool wait_for_init);

  absl::StatusOr<v1::GetStatusResponse> GetStatus(uint32_t shard);

  // One SparsePushPull per non-empty shard, in parallel (docs/protocol.md
  // 14). INVALID_ARGUMENT, before sending, when `local`'s indices and values
  // differ in count or an index is not below d; the servers refuse the rest.
  absl::Status ExchangeSparse(uint64_t step, const SparseVector& local,
                              SparseVector* result) override;

  // Asynchronous SGD (docs/protocol.md): pushes the model-sized gradient
  // `grad` of this worker's step `step`; every shard applies
  // x <- x - lr * Direction(g) at once and answers with its updated floats,
  // written into `model` (model-sized; may alias `grad`) when every shard
  // has answered. Waits while the servers hold this worker back
  // (algorithm.staleness). Counted as GRAD traffic.
  absl::Status AsyncPushPull(uint64_t step, float lr, absl::Span<const float> grad,
                             absl::Span<float> model);

  uint32_t rank() const { return rank_; }
  const BlockLayout& layout() const { return layout_; }
  // Serialized request / reply bytes of every call (PushPull, PushModel,
  // PullModel, SparsePushPull, AsyncPushPull).
  uint64_t bytes_pushed() const { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const { return bytes_pulled_.load(); }
  // PushPull traffic of one stream.
  struct StreamTraffic {
    uint64_t bytes_pushed = 0;
    uint64_t bytes_pulled = 0;
    uint64_t floats_pushed = 0;  // payload values only
  };
  StreamTraffic traffic(v1::Stream stream) const;
  // SparsePushPull traffic; floats_pushed counts the values (each also
  // carries a 4-byte index).
  StreamTraffic sparse_traffic() const;
  // AsyncPushPull traffic (the gradients pushed, the models pulled).
  StreamTraffic async_traffic() const;
  // Total time callers have spent blocked waiting for the servers' replies.
  absl::Duration wait_time() const { return absl::Nanoseconds(wait_nanos_.load()); }

 private:
  PsClient(const v1::JobConfig& config, uint64_t num_params, PsClientOptions options);

  // The whole model cut per shard into chunks of at most chunk_floats_:
  // how PushModel, PullModel and AsyncPushPull send it.
  struct ModelChunk {
    uint32_t shard = 0;
    uint64_t offset = 0;  // global float index
    uint64_t count = 0;
  };
  std::vector<ModelChunk> ModelChunks() const;
  // The payload of every shard (this client's or not) in round
  // (stream, step, ratio), by shard.
  std::vector<ShardPayload> RoundPayloads(v1::Stream stream, uint64_t step,
                                          uint32_t ratio) const;
  RoundSetup MakeRoundSetup(v1::Stream stream, uint64_t step, uint32_t ratio,
                            float weight, float lr);
  bool TalksTo(uint32_t shard) const {
    return shard % options_.shard_stride == options_.shard_offset;
  }

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
  uint32_t rank_ = 0;
  std::atomic<int64_t> wait_nanos_{0};
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  // By v1::Stream value.
  struct StreamCounters {
    std::atomic<uint64_t> bytes_pushed{0};
    std::atomic<uint64_t> bytes_pulled{0};
    std::atomic<uint64_t> floats_pushed{0};
  };
  StreamCounters streams_[3];
  StreamCounters sparse_;
  StreamCounters async_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_CLIENT_H_
