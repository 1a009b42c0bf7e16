#include "worker/cuda/nccl_group.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/cuda/rendezvous_file.h"

namespace cserps {
namespace {

enum Kind : int64_t { kAllReduceSum = 1, kBroadcast = 2 };

std::string Describe(int64_t kind, int64_t count, int64_t root) {
  if (kind == kAllReduceSum) return absl::StrCat("AllReduceSum of ", count, " floats");
  if (kind == kBroadcast) {
    return absl::StrCat("Broadcast from local rank ", root, " of ", count, " floats");
  }
  return absl::StrCat("an unknown collective (kind ", kind, ")");
}

// How often a waiting member looks at its stream and communicator: short
// against a collective's milliseconds, long enough not to burn a core.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

}  // namespace

absl::Status NcclStatus(ncclResult_t result, absl::string_view call, const char* file,
                        int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case ncclSystemError:
    case ncclRemoteError:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  std::string detail = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&detail, " (", last, ")");
  return internal::CallFailedStatus(code, call, file, line, detail);
}

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(uint32_t local_rank,
                                                             uint32_t size,
                                                             NcclGroupOptions options) {
  if (size < 1 || local_rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclGroup: local rank ", local_rank, " is not a local rank of a group of ", size));
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NcclGroup on local rank ", local_rank, ": no CUDA device is visible"));
  }
  const int device = options.device >= 0 ? options.device : static_cast<int>(local_rank);
  if (device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NcclGroup on local rank ", local_rank, ": CUDA device ", device,
        " does not exist; this process sees ", devices,
        " (CUDA_VISIBLE_DEVICES?); a node needs one GPU per local rank"));
  }
  CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  // Local rank 0's published id goes whether the group comes up or not: a
  // later run's local ranks would otherwise read it and join a dead root.
  bool published = false;
  absl::Cleanup unpublish = [&] {
    if (!published) return;
    const absl::Status removed = RemoveRendezvousFile(options.id_path);
    if (!removed.ok()) spdlog::warn("NcclGroup: {}", removed.ToString());
  };
  if (local_rank == 0) {
    CSERPS_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (size > 1) {
      RETURN_IF_ERROR(PublishRendezvousFile(
          options.id_path, absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
      published = true;
    }
  } else {
    ASSIGN_OR_RETURN(const std::string bytes,
                     AwaitRendezvousFile(options.id_path, sizeof(id),
                                         {.timeout = options.setup_timeout}));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }

  std::unique_ptr<NcclGroup> group(new NcclGroup(local_rank, size, device, options.timeout));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&group->stream_, cudaStreamNonBlocking));
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&group->caller_queued_, cudaEventDisableTiming));
  ASSIGN_OR_RETURN(group->agreement_, DeviceBuffer<int64_t>::Allocate(3 * size));

  // Non-blocking, so that neither set-up nor a collective can hang on a
  // peer that never comes: we poll and abort instead.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t started = ncclCommInitRankConfig(&group->comm_, static_cast<int>(size),
                                                      id, static_cast<int>(local_rank),
                                                      &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    group->comm_ = nullptr;
    return NcclStatus(started, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  // Until it is up, a failure leaves the communicator to be aborted (the
  // destructor aborts a broken group's).
  const absl::Status up = [&]() -> absl::Status {
    const absl::Time deadline = absl::Now() + options.setup_timeout;
    while (true) {
      ncclResult_t state = ncclSuccess;
      CSERPS_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(group->comm_, &state));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        const absl::Status failed =
            NcclStatus(state, "ncclCommInitRankConfig", __FILE__, __LINE__);
        return absl::Status(failed.code(),
                            absl::StrCat(failed.message(), "; id from ", options.id_path));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "NcclGroup on local rank ", local_rank, " of ", size,
            ": the communicator did not come up within ",
            absl::FormatDuration(options.setup_timeout),
            " (has every local rank started? a leftover ", options.id_path,
            " from a run that crashed sends them to a dead root: remove it)"));
      }
      absl::SleepFor(kPollInterval);
    }
  }();
  // Up, every member has joined, so every member has read the id.
  if (!up.ok()) return group->Break(up);
  return group;
}

NcclGroup::NcclGroup(uint32_t local_rank, uint32_t size, int device, absl::Duration timeout)
    : local_rank_(local_rank), size_(size), device_(device), timeout_(timeout) {}

NcclGroup::~NcclGroup() {
  static_cast<void>(cudaSetDevice(device_));
  if (comm_ != nullptr && !aborted_) {
    // A healthy communicator is finalised (bounded, as everything here);
    // a failed one, or one that will not finalise, is aborted.
    bool finalized = false;
    if (broken_.ok() && ncclCommFinalize(comm_) == ncclInProgress) {
      const absl::Time deadline = absl::Now() + timeout_;
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress && absl::Now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
        if (state == ncclInProgress) absl::SleepFor(kPollInterval);
      }
      finalized = state == ncclSuccess;
    } else if (broken_.ok()) {
      ncclResult_t state = ncclInProgress;
      finalized = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
    }
    if (finalized) {
      static_cast<void>(ncclCommDestroy(comm_));
    } else {
      static_cast<void>(ncclCommAbort(comm_));
    }
  }
  staging_.Reset();
  agreement_.Reset();
  if (caller_queued_ != nullptr) static_cast<void>(cudaEventDestroy(caller_queued_));
  if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
}

absl::Status NcclGroup::Break(absl::Status status) {
  if (broken_.ok()) broken_ = status;
  return status;
}

absl::Status NcclGroup::CheckNotBroken(absl::string_view what) const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(what, " on local rank ", local_rank_,
                                         ": the local group failed earlier: ",
                                         broken_.message()));
}

absl::Status NcclGroup::Issued(ncclResult_t result, absl::string_view call) {
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return NcclStatus(result, call, __FILE__, __LINE__);
  // A non-blocking communicator may still be enqueueing the operation.
  const absl::Time deadline = absl::Now() + timeout_;
  while (true) {
    ncclResult_t state = ncclSuccess;
    CSERPS_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, call, __FILE__, __LINE__);
    if (absl::Now() >= deadline) {
      static_cast<void>(ncclCommAbort(comm_));
      aborted_ = true;
      return absl::DeadlineExceededError(absl::StrCat(
          call, " on local rank ", local_rank_, " was not enqueued within ",
          absl::FormatDuration(timeout_), "; communicator aborted"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status NcclGroup::Complete(absl::string_view what) {
  const absl::Time deadline = absl::Now() + timeout_;
  while (true) {
    const cudaError_t query = cudaStreamQuery(stream_);
    if (query == cudaSuccess) return absl::OkStatus();
    if (query != cudaErrorNotReady) {
      return CudaStatus(query, absl::StrCat("cudaStreamQuery after ", what), __FILE__,
                        __LINE__);
    }
    ncclResult_t state = ncclSuccess;
    CSERPS_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclStatus(state, absl::StrCat("ncclCommGetAsyncError during ", what),
                        __FILE__, __LINE__);
    }
    if (absl::Now() >= deadline) {
      static_cast<void>(ncclCommAbort(comm_));
      aborted_ = true;
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": not every local rank joined within ", absl::FormatDuration(timeout_),
          " (NCCL cannot say which); communicator aborted"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status NcclGroup::EnsureStaging(size_t floats) {
  if (staging_.size() >= floats) return absl::OkStatus();
  // Freeing the old buffer waits for the whole device (cudaFree). It grows
  // to the largest host collective only: on the device path those are a few
  // floats (ShareStatus, the node weight), so this happens once.
  staging_.Reset();
  ASSIGN_OR_RETURN(staging_, DeviceBuffer<float>::Allocate(floats));
  return absl::OkStatus();
}

absl::Status NcclGroup::AgreeOn(int64_t kind, int64_t count, int64_t root,
                                absl::string_view what) {
  const int64_t mine[3] = {kind, count, root};
  int64_t* slot = agreement_.data() + 3 * local_rank_;
  CSERPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(slot, mine, sizeof(mine), cudaMemcpyHostToDevice, stream_));
  RETURN_IF_ERROR(Issued(
      ncclAllGather(slot, agreement_.data(), 3, ncclInt64, comm_, stream_), "ncclAllGather"));
  RETURN_IF_ERROR(Complete(absl::StrCat(what, " (agreeing on the collective)")));
  std::vector<int64_t> all(3 * size_);
  CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(all.data(), agreement_.data(),
                                         all.size() * sizeof(int64_t),
                                         cudaMemcpyDeviceToHost));
  for (uint32_t r = 0; r < size_; ++r) {
    const int64_t* theirs = all.data() + 3 * r;
    if (theirs[0] != kind || theirs[1] != count || theirs[2] != root) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": local rank ", r, " called ",
                       Describe(theirs[0], theirs[1], theirs[2]), " instead"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclGroup::RunCollective(
    int64_t kind, size_t count, uint32_t root, bool on_device,
    absl::FunctionRef<absl::Status(absl::string_view what)> body) {
  const char* where = on_device ? " on the device" : "";
  if (root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Broadcast", where, " on local rank ", local_rank_, ": root ", root,
        " is not a local rank of a group of ", size_));
  }
  const std::string what =
      absl::StrCat(Describe(kind, static_cast<int64_t>(count), root), where,
                   " (collective #", completed_, ") on local rank ", local_rank_);
  RETURN_IF_ERROR(CheckNotBroken(what));
  CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(AgreeOn(kind, static_cast<int64_t>(count), root, what));
    if (count == 0) return absl::OkStatus();
    return body(what);
  }();
  if (!status.ok()) return Break(status);
  ++completed_;
  return absl::OkStatus();
}

absl::Status NcclGroup::InPlace(int64_t kind, uint32_t root, float* data, size_t count,
                                cudaStream_t after, absl::string_view what) {
  if (after != stream_) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(caller_queued_, after));
    CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, caller_queued_, 0));
  }
  if (kind == kAllReduceSum) {
    RETURN_IF_ERROR(Issued(
        ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm_, stream_),
        "ncclAllReduce"));
  } else {
    RETURN_IF_ERROR(Issued(ncclBroadcast(data, data, count, ncclFloat,
                                         static_cast<int>(root), comm_, stream_),
                           "ncclBroadcast"));
  }
  return Complete(what);
}

absl::Status NcclGroup::AllReduceSum(absl::Span<float> data) {
  return RunCollective(
      kAllReduceSum, data.size(), 0, /*on_device=*/false,
      [&](absl::string_view what) -> absl::Status {
        RETURN_IF_ERROR(EnsureStaging(data.size()));
        CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.data(), data.data(),
                                                    data.size() * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
        // InPlace waits for the collective before the copy back: a copy to
        // pageable memory would block on it with no timeout.
        RETURN_IF_ERROR(
            InPlace(kAllReduceSum, 0, staging_.data(), data.size(), stream_, what));
        CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(data.data(), staging_.data(),
                                               data.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost));
        return absl::OkStatus();
      });
}

absl::Status NcclGroup::Broadcast(uint32_t root, absl::Span<float> data) {
  return RunCollective(
      kBroadcast, data.size(), root, /*on_device=*/false,
      [&](absl::string_view what) -> absl::Status {
        RETURN_IF_ERROR(EnsureStaging(data.size()));
        if (local_rank_ == root) {
          CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging_.data(), data.data(),
                                                      data.size() * sizeof(float),
                                                      cudaMemcpyHostToDevice, stream_));
        }
        RETURN_IF_ERROR(
            InPlace(kBroadcast, root, staging_.data(), data.size(), stream_, what));
        if (local_rank_ != root) {
          CSERPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(data.data(), staging_.data(),
                                                 data.size() * sizeof(float),
                                                 cudaMemcpyDeviceToHost));
        }
        return absl::OkStatus();
      });
}

absl::Status NcclGroup::AllReduceSumOnDevice(float* data, size_t count,
                                             cudaStream_t stream) {
  return RunCollective(kAllReduceSum, count, 0, /*on_device=*/true,
                       [&](absl::string_view what) {
                         return InPlace(kAllReduceSum, 0, data, count, stream, what);
                       });
}

absl::Status NcclGroup::BroadcastOnDevice(uint32_t root, float* data, size_t count,
                                          cudaStream_t stream) {
  return RunCollective(kBroadcast, count, root, /*on_device=*/true,
                       [&](absl::string_view what) {
                         return InPlace(kBroadcast, root, data, count, stream, what);
                       });
}

}  // namespace cserps
