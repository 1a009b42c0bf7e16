// LocalGroup over NCCL: the local ranks of a node are processes, one per
// GPU, and their collectives run on the GPUs (built only with CUDA).
//
// Set-up: local rank 0 creates the ncclUniqueId and publishes it in a file
// of a node-local directory (worker/cuda/rendezvous_file.h); the others
// wait for that file, and all then join one NCCL communicator. Once it is
// up, every rank has read the id and local rank 0 removes the file.
//
// It is also a DeviceGroup (worker/cuda/device_group.h): the same
// collectives in place on device memory, for a node's staged average.
#ifndef CSERPS_WORKER_CUDA_NCCL_GROUP_H_
#define CSERPS_WORKER_CUDA_NCCL_GROUP_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/status.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/device_group.h"
#include "worker/group/local_group.h"

// Returns a Status naming the NCCL call, the file and the line when `call`
// does not return ncclSuccess (nccl-tests' NCCLCHECK, but returning); one of
// the family of worker/cuda/kernels/cuda_status.h.
#define CSERPS_NCCL_RETURN_IF_ERROR(call) \
  RETURN_IF_ERROR(::cserps::NcclStatus((call), #call, __FILE__, __LINE__))

namespace cserps {

// "<call> failed at <file>:<line>: <ncclGetErrorString>"; OK for
// ncclSuccess. Codes: ncclInvalidArgument and ncclInvalidUsage are
// INVALID_ARGUMENT, ncclSystemError and ncclRemoteError UNAVAILABLE (a peer
// or the network went away), the rest INTERNAL.
absl::Status NcclStatus(ncclResult_t result, absl::string_view call, const char* file,
                        int line);

struct NcclGroupOptions {
  // The rendezvous file of the ncclUniqueId: in a node-local directory that
  // every local rank of the node names alike and no other node or job
  // shares (worker_main: /dev/shm/cserps-<job>-<node id>/nccl_id, or
  // --group_dir).
  std::string id_path;
  // CUDA device of this local rank; -1: device local_rank.
  int device = -1;
  // How long set-up may take: local ranks waiting for the id file, and the
  // communicator's initialisation waiting for every rank to join.
  absl::Duration setup_timeout = absl::Minutes(5);
  // How long a collective may wait for the other members (see LocalGroup);
  // after it the communicator is aborted.
  absl::Duration timeout = absl::Minutes(5);
};

// One process's member. Each host collective copies the host buffer to a
// device buffer of this member (grown to the largest collective, never
// shrunk), runs the NCCL collective on the member's stream and copies the
// result back, waiting for it. The device collectives (DeviceGroup) run the
// same NCCL collective in place on the caller's device memory: the member's
// stream waits for an event recorded on the caller's stream, and the call
// returns once the member's stream has run it. AllReduceSum is
// ncclAllReduce with ncclSum; NCCL computes each element once, in an order
// fixed by the communicator, and sends that result to every member, so
// every member gets the same bits. Broadcast is ncclBroadcast.
//
// Before each collective the members all-gather what they were asked to do
// (kind, length, root), so that members that disagree get
// FAILED_PRECONDITION naming both instead of corrupt data or a hang.
//
// The communicator is non-blocking: a collective that does not complete
// within `timeout` (a member that never joins) aborts it and fails with
// DEADLINE_EXCEEDED; NCCL cannot say which local rank is missing. After any
// failure every collective fails ABORTED (LocalGroup's contract).
//
// Not thread-safe: one thread at a time; that thread's current CUDA device
// is set to this member's device by every call.
class NcclGroup final : public LocalGroup, public DeviceGroup {
 public:
  // Local rank `local_rank` of `size` (>= 1; local_rank < size, else
  // INVALID_ARGUMENT). Errors: FAILED_PRECONDITION for no CUDA device or a
  // device index past the last; the rendezvous file's errors
  // (DEADLINE_EXCEEDED naming the path when local rank 0 never publishes);
  // DEADLINE_EXCEEDED when the communicator does not come up within
  // setup_timeout; every CUDA or NCCL failure as a Status naming the call.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(uint32_t local_rank,
                                                           uint32_t size,
                                                           NcclGroupOptions options);
  ~NcclGroup() override;

  uint32_t local_rank() const override { return local_rank_; }
  uint32_t size() const override { return size_; }
  int device() const { return device_; }

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Broadcast(uint32_t root, absl::Span<float> data) override;

  // `data`: device memory of device(); `stream`: a stream of device().
  absl::Status AllReduceSumOnDevice(float* data, size_t count,
                                    cudaStream_t stream) override;
  absl::Status BroadcastOnDevice(uint32_t root, float* data, size_t count,
                                 cudaStream_t stream) override;

 private:
  NcclGroup(uint32_t local_rank, uint32_t size, int device, absl::Duration timeout);

  // Every member's (kind, count, root), checked for agreement; `what` names
  // the collective in messages.
  absl::Status AgreeOn(int64_t kind, int64_t count, int64_t root, absl::string_view what);
  // Waits until the work queued on stream_ is done, the communicator fails
  // or `timeout_` passes (then aborts it).
  absl::Status Complete(absl::string_view what);
  // `result` of an NCCL call on the non-blocking communicator: ncclInProgress
  // is waited out.
  absl::Status Issued(ncclResult_t result, absl::string_view call);
  absl::Status EnsureStaging(size_t floats);
  // Records a failure: every later collective fails ABORTED quoting it.
  absl::Status Break(absl::Status status);
  absl::Status CheckNotBroken(absl::string_view what) const;
  // What every collective shares: the root's check, the broken check, the
  // device, the agreement, and on failure Break. `body` (given the
  // collective's name for messages) moves the data; it is not called for
  // count 0.
  absl::Status RunCollective(int64_t kind, size_t count, uint32_t root, bool on_device,
                             absl::FunctionRef<absl::Status(absl::string_view what)> body);
  // Collective `kind` in place on `count` floats of device memory, on
  // stream_ after the work queued on `after` so far; waits for it
  // (Complete). No agreement: RunCollective's body.
  absl::Status InPlace(int64_t kind, uint32_t root, float* data, size_t count,
                       cudaStream_t after, absl::string_view what);

  const uint32_t local_rank_;
  const uint32_t size_;
  const int device_;
  const absl::Duration timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t caller_queued_ = nullptr;  // the caller's stream → stream_
  bool aborted_ = false;  // comm_ was aborted: destroy nothing more of it
  DeviceBuffer<float> staging_;
  DeviceBuffer<int64_t> agreement_;  // 3 * size_
  uint64_t completed_ = 0;           // collectives, for messages
  absl::Status broken_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_NCCL_GROUP_H_
