// The average of a model-sized vector that lives on a device: the
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
// worker/cuda/cuda_staging.h; the host one is
// worker/device/host_device_ops.h.
#ifndef CSERPS_WORKER_PS_STAGED_AVERAGE_H_
#define CSERPS_WORKER_PS_STAGED_AVERAGE_H_

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "cserps/v1/parameter_server.pb.h"
#include "worker/group/local_group.h"
#include "worker/ps/sharded_average.h"

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
  // ids, read before this returns) concatenated (worker/cuda/kernels/block_gather.h).
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

  // For the average of a node (StartStagedAverage with a group), on a device
  // made with its local group; FAILED_PRECONDITION on one made without.
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

// An average started through a staging device and not yet landed: its
// payloads are on the wire (or sent), its replies still to come. Destroying
// it unlanded waits for the replies and drops them.
class StagedRound {
 public:
  virtual ~StagedRound() = default;
  // Waits for every reply and queues the weighted mean of every member's
  // values into `target` (a model-sized buffer of the device) on the
  // selected blocks, as `kind` and `alpha` say, leaving the other floats
  // alone. Returns once the scatter has been queued; the caller orders its
  // later work after the device's queue. Call once. On a node a collective,
  // called by every local rank in the order of their starts.
  virtual absl::Status Land(ScatterKind kind, float alpha, float* target) = 0;
};

// What an average is: the job's layout and seed, the round's stream, step
// and ratio, and the member's weight. For the local ranks of a node,
// `group` is the node's group (docs/node_groups.md), `weight` this local
// rank's, and the node takes part as one member of the summed weight.
struct StagedAverageSpec {
  const BlockLayout* layout = nullptr;
  uint64_t job_seed = 0;
  v1::Stream stream = v1::GRAD;
  uint64_t step = 0;
  uint32_t ratio = 1;
  float weight = 1.0f;
  LocalGroup* group = nullptr;  // null: a flat worker
};

// A client's round for the member's weight (its BeginShardedAverage for the
// spec's stream, step and ratio). Flat, from a client that talks to every
// shard; on a node, this local rank's client (the shards s with
// s mod L = local rank), called with the node's weight.
using BeginRound = absl::FunctionRef<std::unique_ptr<ShardedAverage>(float weight)>;

// Starts the average of `values` (a model-sized buffer of `device`, read by
// the queued gather: the caller may change it once the device's queue has
// passed this point) and returns once every payload of this member is on
// the wire. The device stays in use by the round until it is landed or
// destroyed.
//
// Flat: the selected blocks are gathered into the staging, each shard's
// run copied to the host and pushed as soon as it has landed.
// On a node (spec.group set; `device` made with that group): every local
// rank gathers its weight·values, the group sums them on the devices
// (AllReduceStaging) and the weights on the host; local rank j divides its
// shards' runs by the node weight W and pushes them with weight W, and
// Land shares every shard's mean from its owner (BroadcastStaging) before
// the scatter. A collective: every local rank starts the same averages in
// the same order. The means equal the host sum's bit for bit when the
// group sums in rank order whatever the layout (ThreadGroup); NCCL's order
// depends on the buffer's layout, so with three or more local ranks a mean
// may differ in the last bit from a host group's (every local rank still
// gets the same bits).
//
// Errors: the round's (naming the shard), the device's, or
// FAILED_PRECONDITION when the round's payloads are not this layout's
// selection (a client covering other shards, or a mismatched round). On a
// node, the error of the local rank that failed (its device before the
// group's sum, or its shards), and on its peers an error of the same code
// naming it (ShareStatus); a failed collective fails every local rank.
absl::StatusOr<std::unique_ptr<StagedRound>> StartStagedAverage(
    const StagedAverageSpec& spec, BeginRound begin_round, StagingDevice& device,
    const float* values);

// StartStagedAverage, then Land: `values` and `target` may be the same.
absl::Status StagedAverage(const StagedAverageSpec& spec, BeginRound begin_round,
                           StagingDevice& device, const float* values, ScatterKind kind,
                           float alpha, float* target);

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_STAGED_AVERAGE_H_
