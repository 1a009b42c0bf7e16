// The worker's client of the sharded parameter server, ps-lite's KVWorker
// in spirit: Register, the averaging rounds (whole, or shard by shard for a
// staged average), Push/Pull of the model, the sparse exchange and
// asynchronous SGD's push. The gRPC channels and stubs are internal.
//
// Each call sends one RPC per shard and chunk, all in parallel, and returns
// when every shard has answered. A Register, round, PushModel or PullModel
// call that fails UNAVAILABLE (its connection reset, its server restarting
// at the same address) is sent again with capped exponential backoff until
// its deadline: pushes are counted once per round and rank (asynchronous
// ones once per rank, offset and step), so a retry never counts twice.
// GetStatus, Rejoin and RollBack are sent once (docs/protocol.md 13).
// Thread safety: one thread at a time per client; the traffic accessors
// may be read from any thread.
#ifndef CSERPS_WORKER_PS_PS_CLIENT_H_
#define CSERPS_WORKER_PS_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "common/traffic_counter.h"
#include "cserps/v1/config.pb.h"
#include "cserps/v1/parameter_server.pb.h"
#include "worker/ps/communicator.h"

namespace cserps {

struct PsClientOptions {
  // Extra time a PushPull may take beyond the round timeout.
  absl::Duration rpc_slack = absl::Seconds(30);
  // Deadline of Register, PushModel and PullModel calls (which wait for the
  // servers to come up and for rank 0 to initialise the model).
  absl::Duration setup_timeout = absl::Seconds(120);
  // Talk only to the shards s with s % shard_stride == shard_offset: those
  // of local rank shard_offset in an intra-node group of shard_stride
  // processes (worker/ps/node_client.h). Every call then covers
  // only those shards: Register registers with them alone, averages,
  // PushModel, PullModel and AsyncPushPull read and write only their
  // floats, ExchangeSparse sends and returns only their entries, GetStatus
  // refuses other shards. The defaults, 1 and 0: every shard.
  uint32_t shard_stride = 1;
  uint32_t shard_offset = 0;
};

class PsClient final : public Communicator {
 public:
  // `config` has defaults applied and is valid; `num_params` is the model's d.
  // INVALID_ARGUMENT for no servers, shard_stride 0 or shard_offset not
  // below shard_stride.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const v1::JobConfig& config, uint64_t num_params, PsClientOptions options = {});
  ~PsClient() override;

  // Joins the job on every shard; shard 0 (the first of this client's
  // shards) assigns the rank when `requested_rank` < 0. A client with no
  // shards sends nothing and takes `requested_rank`, which must then be
  // >= 0 (INVALID_ARGUMENT otherwise). Returns the rank.
  absl::StatusOr<uint32_t> Register(int requested_rank, const std::string& worker_id);
  // Register again with the rank and worker id of the last Register (after a
  // shard restarted): the same rank on every shard.
  absl::Status Reregister();

  // One whole average on host memory (ps-lite's PushPull): averages `values`
  // (model-sized) with `weight` over the blocks GRBS(stream, step, ratio)
  // (ratio 1: every block), `lr` being what the servers apply on GRAD
  // rounds, and writes the weighted mean of every member's values into the
  // selected floats of `mean` (model-sized; may be `values`), leaving the
  // others as they are. INVALID_ARGUMENT for a `values` or `mean` that is
  // not d floats; the first shard's error, naming it.
  absl::Status AverageBlocks(v1::Stream stream, uint64_t step, uint32_t ratio,
                             absl::Span<const float> values, float weight, float lr,
                             absl::Span<float> mean);

  // The round AverageBlocks(stream, step, ratio, ...) would run, with the
  // payloads left to the caller (sharded_average.h).
  std::unique_ptr<ShardedAverage> BeginShardedAverage(v1::Stream stream, uint64_t step,
                                                      uint32_t ratio, float weight,
                                                      float lr) override;

  // Writes the whole model to the servers (rank 0 initialising the job).
  absl::Status PushModel(absl::Span<const float> model);
  // Reads the whole model; with `wait_for_init`, waits until it was pushed.
  absl::Status PullModel(absl::Span<float> model, bool wait_for_init) override;

  absl::StatusOr<v1::GetStatusResponse> GetStatus(uint32_t shard);
  // Elastic: asks `shard` to take this client's (dropped) rank back into
  // its rounds from the full average of `step` on (docs/protocol.md 7.11);
  // the shard's refusal as it is.
  absl::Status Rejoin(uint32_t shard, uint64_t step);
  // Asks `shard` to go back to the checkpoint of `step` in place, which the
  // shard of incarnation `restarted` restarted from (docs/protocol.md 7.12).
  absl::Status RollBack(uint32_t shard, uint64_t step, uint64_t restarted);
  // The incarnation `shard` reported at the last Register; 0: none.
  uint64_t incarnation(uint32_t shard) const;

  // One SparsePushPull per non-empty shard, in parallel (docs/protocol.md
  // 14). INVALID_ARGUMENT, before sending, when `local`'s indices and values
  // differ in count or an index is not below d; the servers refuse the rest.
  absl::Status ExchangeSparse(uint64_t step, const SparseVector& local,
                              SparseVector* result) override;

  // Asynchronous SGD (docs/protocol.md), as Communicator::AsyncPushPull:
  // every shard answers with its updated floats. Counted as async traffic.
  absl::Status AsyncPushPull(uint64_t step, float lr, absl::Span<const float> grad,
                             absl::Span<float> model) override;

  uint32_t rank() const;
  // The step of the checkpoint this client's shards resumed from, as
  // Register reported it (shards that disagree fail Register,
  // FAILED_PRECONDITION); 0: they started fresh.
  uint64_t resumed_from_step() const;
  // A node's local ranks resume together (node_client.h): a client with no
  // shards of its own takes `node_step`, the step its node's shard 0
  // resumed from; FAILED_PRECONDITION, naming both, when this client's
  // shards resumed from another.
  absl::Status AgreeResumedFromStep(uint64_t node_step);
  const BlockLayout& layout() const override;

  // Traffic, counted as the calls go: the serialized requests (pushed) and
  // replies (pulled), and the payload floats pushed.
  // Request and reply bytes of every call (PushPull, PushModel, PullModel,
  // SparsePushPull, AsyncPushPull).
  uint64_t bytes_pushed() const;
  uint64_t bytes_pulled() const;
  // PushPull traffic of one stream.
  TrafficCounts traffic(v1::Stream stream) const;
  // SparsePushPull traffic; request_floats counts the values (each also
  // carries a 4-byte index).
  TrafficCounts sparse_traffic() const;
  // AsyncPushPull traffic (the gradients pushed, the models pulled).
  TrafficCounts async_traffic() const;
  // Total time callers have spent blocked waiting for the servers' replies.
  absl::Duration wait_time() const;
  // Calls (chunks, for rounds) sent again after they lost their connection
  // (UNAVAILABLE), with capped exponential backoff inside their deadline.
  uint64_t retries() const;
  // The members the servers' rounds wait for, as their replies said: the
  // job's num_workers until an elastic job drops one (the fewest of the
  // shards' latest replies), more again once it admits one back.
  uint32_t members() const;

 private:
  struct Impl;  // ps_client.cc: the channels, stubs and counters
  explicit PsClient(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_PS_CLIENT_H_
