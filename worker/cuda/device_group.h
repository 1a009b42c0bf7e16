// A local group (worker/group/local_group.h) whose collectives can also run
// in place on this member's device memory, ordered after a CUDA stream.
//
// Why: a node of GPUs averages through the staged average
// (worker/ps/staged_average.h), whose staging buffer lives on the device. Its
// two collectives (the node's sum of the gathered values, and each shard's
// mean shared from its owner) would otherwise copy the staging buffer to
// the host and back around a collective that itself runs on the GPUs. With
// this interface the CUDA staging device (worker/cuda/cuda_staging.h) hands
// the group the staging buffer and its compute stream, and nothing crosses
// PCIe but the shards' own runs. NcclGroup (worker/cuda/nccl_group.h) is
// the implementation; the worker gives it to the CUDA device ops
// (worker/cuda/cuda_device_ops.h) as their node group, beside the
// LocalGroup it gives the trainer.
//
// Header only, so that the CUDA worker library does not link NCCL to name
// it.
#ifndef CSERPS_WORKER_CUDA_DEVICE_GROUP_H_
#define CSERPS_WORKER_CUDA_DEVICE_GROUP_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace cserps {

// The device half of a member's handle. The collectives are the
// LocalGroup's: every member calls the same collectives (host and device
// ones counted alike) in the same order, with the same count and root.
//
// `data` is `count` floats of device memory of this member's device, owned
// by the caller. The collective is ordered after the work queued on
// `stream` before the call (so it reads what that work wrote), and the call
// returns once the collective is complete: data holds the result, and work
// queued on any stream afterwards sees it. Nothing is copied to the host.
//
// Errors are LocalGroup's: DEADLINE_EXCEEDED when a member does not join in
// time, FAILED_PRECONDITION when the members disagree about the collective,
// ABORTED for every collective once the group is broken; INVALID_ARGUMENT
// for a root not below the group's size, before joining.
//
// Thread safety: as the LocalGroup's (one thread at a time per member).
class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;

  // data <- the element-wise float32 sum over the members, the same bits on
  // every member.
  virtual absl::Status AllReduceSumOnDevice(float* data, size_t count,
                                            cudaStream_t stream) = 0;

  // data <- local rank `root`'s data, bit for bit (the root's is left as
  // it is).
  virtual absl::Status BroadcastOnDevice(uint32_t root, float* data, size_t count,
                                         cudaStream_t stream) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_DEVICE_GROUP_H_
