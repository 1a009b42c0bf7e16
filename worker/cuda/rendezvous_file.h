// A few bytes handed from one process of a node to the others through a
// file in a node-local directory: how the local ranks of an NCCL group
// (worker/cuda/nccl_group.h) share local rank 0's ncclUniqueId. Kept apart
// from NCCL so that it builds and is tested without CUDA.
//
// The writer publishes atomically (a temporary file in the same directory,
// then rename), so a reader sees either no file or all of it. A file left by
// an earlier run of the same job is indistinguishable from a fresh one: the
// writer removes the file once every reader has used it
// (RemoveRendezvousFile), and a reader that starts before the writer can
// still pick up a crashed run's leftover; NcclGroup then fails naming the
// path.
#ifndef CSERPS_WORKER_CUDA_RENDEZVOUS_FILE_H_
#define CSERPS_WORKER_CUDA_RENDEZVOUS_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace cserps {

// Writes `bytes` to `path`, creating its directory (mode 0700) when missing
// and replacing any file already there. Errors name the path and the
// failing operation (create_directories, open, write, rename), with the
// errno's status code.
absl::Status PublishRendezvousFile(const std::string& path, absl::string_view bytes);

struct RendezvousWaitOptions {
  // How long to wait for the file to appear.
  absl::Duration timeout = absl::Minutes(5);
  // How often to look.
  absl::Duration poll_interval = absl::Milliseconds(10);
};

// Waits until `path` exists (its directory need not exist yet) and returns
// its contents, which must be exactly `size` bytes. DEADLINE_EXCEEDED naming
// the path and the timeout when it does not appear in time; DATA_LOSS naming
// the path and both sizes for a file of another size (not a partial write,
// which publishing rules out: a foreign file); another read error with the
// errno's code, naming the path. Blocks the calling thread.
absl::StatusOr<std::string> AwaitRendezvousFile(const std::string& path, size_t size,
                                                RendezvousWaitOptions options = {});

// Removes `path`; OK when it is already gone. Errors name the path.
absl::Status RemoveRendezvousFile(const std::string& path);

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_RENDEZVOUS_FILE_H_
