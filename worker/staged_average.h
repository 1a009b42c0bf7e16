// The average of a model-sized vector that lives on a device (issue 6): the
// GRBS-selected blocks are gathered on the device into a contiguous staging
// buffer, each shard's run of it is copied to (pinned) host memory and
// pushed as soon as its copy has landed, each reply is copied back into the
// staging buffer as it is awaited, and the means are scattered into the
// target on the device. Shard s's request is on the wire while shard s+1's
// run is still being copied, and shard s's reply is copied up while shard
// s+1's is still awaited.
//
// The device side is the small interface StagingDevice, so that the order
// of operations is testable without a device; the CUDA implementation is
// worker/cuda/cuda_staging.h.
#ifndef CSERPS_WORKER_STAGED_AVERAGE_H_
#define CSERPS_WORKER_STAGED_AVERAGE_H_

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "worker/group/local_group.h"
#include "worker/ps_client.h"

namespace cserps {

// How the means land in the target: target[S] = mean, or
// target[S] = target[S] + alpha * mean (with alpha = -lr: x[S] -= lr * mean,
// bit for bit).
enum class ScatterKind { kAssign, kAxpy };

// The device operations of a staged average. A device holds one staging
// buffer (device memory) and a host buffer (pinned) of the same capacity;
// "queues" means the operation is ordered after everything queued before it
// on this device and may run later. Model pointers are this device's
// model-sized buffers. Not thread-safe.
class StagingDevice {
 public:
  virtual ~StagingDevice() = default;

  // Floats the staging and host buffers hold (at least the model size).
  virtual uint64_t capacity() const = 0;
  // The host buffer: what CopyToHost fills and CopyToStaging reads.
  virtual absl::Span<float> host() = 0;
  // Queues staging = model[blocks]: the blocks (`blocks`: ascending global
  // ids, read before this returns) concatenated (worker/cuda/block_gather.h).
  // The block list is kept for Scatter.
  virtual absl::Status Gather(const float* model, absl::Span<const uint64_t> blocks) = 0;
  // Queues host[offset, offset + count) = staging[offset, offset + count),
  // then marks copy `slot` as landed.
  virtual absl::Status CopyToHost(uint32_t slot, uint64_t offset, uint64_t count) = 0;
  // Blocks the calling thread until copy `slot` has landed in host().
  virtual absl::Status WaitCopied(uint32_t slot) = 0;
  // Queues staging[offset, offset + count) = host[offset, offset + count)
  // (host() is read when the copy runs, not when it is queued).
  virtual absl::Status CopyToStaging(uint64_t offset, uint64_t count) = 0;
  // Queues the staging buffer into `model` on the blocks of the last Gather
  // (alpha is ignored for kAssign).
  virtual absl::Status Scatter(ScatterKind kind, float alpha, float* model) = 0;

  // For the average of a node (NodeStagedAverage), on a device made with
  // its local group; FAILED_PRECONDITION on one made without.
  // Queues staging[offset, offset + count) *= factor (kMultiply) or
  // /= factor (kDivide), each float rounded once.
  enum class Scale { kMultiply, kDivide };
  virtual absl::Status ScaleStaging(Scale op, float factor, uint64_t offset,
                                    uint64_t count) = 0;
  // Collectives of the group (every local rank calls them in the same
  // order): staging[0, count) ← the sum over the local ranks; and
  // staging[offset, offset + count) ← local rank `root`'s.
  virtual absl::Status AllReduceStaging(uint64_t count) = 0;
  virtual absl::Status BroadcastStaging(uint32_t root, uint64_t offset, uint64_t count) = 0;
};

// One average round through a device. `round` is the client's
// BeginShardedAverage(stream, step, ratio, weight, lr) for the same stream,
// step and ratio, not yet started, from a client that talks to every shard
// (PsClientOptions' defaults). `values` and `target` are model-sized
// buffers of `device` and may be the same; the queued scatter writes the
// weighted mean of every member's values into `target` as `kind` says and
// leaves the unselected floats alone. Returns once every reply has been
// queued for the device; the caller orders its later work after the
// device's queue. Errors: the round's (naming the shard), the device's, or
// FAILED_PRECONDITION when the round's payloads are not this layout's
// selection (a client covering only some shards, or a mismatched round).
absl::Status StagedAverage(const BlockLayout& layout, uint64_t job_seed,
                           v1::Stream stream, uint64_t step, uint32_t ratio,
                           ShardedAverage& round, StagingDevice& device,
                           const float* values, ScatterKind kind, float alpha,
                           float* target);

// The same round for the local ranks of a node (docs/node_groups.md): the
// device path of HierarchicalCommunicator, with the same bits. Every local
// rank gathers its weight·values on the selected blocks, the group sums
// them on the devices (AllReduceStaging) and the weights on the host; local
// rank j divides its shards' runs by the node weight W, averages them with
// the servers through `begin_round(W)` (its client's BeginShardedAverage:
// a client that talks to the shards s with s mod L = j) and the group
// shares every shard's mean from its owner (BroadcastStaging) before the
// scatter. `device` was made with `group`. A collective: every local rank
// calls it with the same stream, step and ratio. Errors as StagedAverage's,
// on the local rank that failed (its device before the group's sum, or its
// shards), and on its peers an error of the same code naming it
// (ShareStatus); a failed collective fails every local rank. The means
// equal HierarchicalCommunicator's bit for bit when the group sums in rank
// order whatever the layout (ThreadGroup); NCCL's order depends on the
// buffer's layout, which differs between the two, so with three or more
// local ranks a mean may differ in the last bit (every local rank still
// gets the same bits).
absl::Status NodeStagedAverage(
    const BlockLayout& layout, uint64_t job_seed, v1::Stream stream, uint64_t step,
    uint32_t ratio, LocalGroup& group, float weight,
    absl::FunctionRef<std::unique_ptr<ShardedAverage>(float node_weight)> begin_round,
    StagingDevice& device, const float* values, ScatterKind kind, float alpha,
    float* target);

}  // namespace cserps

#endif  // CSERPS_WORKER_STAGED_AVERAGE_H_
