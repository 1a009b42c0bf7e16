// A worker's bulk connection to one shard (docs/protocol.md 17), over TLS
// when the job has it: PushPull requests written from the caller's floats
// (gathered from its spans, no copy), and their replies read straight into
// the caller's mean spans; SparsePushPull requests likewise, their replies
// read into the caller's sparse vector; AsyncPushPull requests, their
// replies read into the caller's model.
// Requests of several rounds may be in flight; a reply is delivered to its
// own request whichever waiter reads it.
//
// Any I/O or framing error breaks the channel: every request then fails
// with that error and nothing more is read, so no reply can land in memory
// its owner has given up. Thread-safe.
#ifndef CSERPS_WORKER_PS_BULK_CHANNEL_H_
#define CSERPS_WORKER_PS_BULK_CHANNEL_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/bulk_wire.h"
#include "common/byte_stream.h"
#include "common/sparse_vector.h"

namespace cserps {

class BulkChannel {
 public:
  // How a channel proves it belongs to the job: TLS with the worker's
  // certificate (null: plaintext) and the job's token (empty: none).
  struct Credentials {
    std::shared_ptr<TlsContext> tls;
    std::string token;
  };

  // Connects and says hello as `rank` of the job with `fingerprint`; the
  // shard's refusal (a wrong fingerprint or token, an unregistered rank, too
  // many connections) is the error, prefixed with `name` ("bulk connection
  // to shard 1 at host:port"), as every later error is.
  static absl::StatusOr<std::unique_ptr<BulkChannel>> Connect(const std::string& host, int port,
                                                              uint64_t fingerprint, uint32_t rank,
                                                              const Credentials& credentials,
                                                              absl::Time deadline,
                                                              std::string name);

  // Sends `request` (its request_id assigned here, its count the floats of
  // `values`) with the floats of `values` in order. The reply's floats will
  // go to `mean` (as many, in order), which must stay alive until Wait
  // returns for the id returned.
  absl::StatusOr<uint64_t> Send(bulk::Request request,
                                absl::Span<const absl::Span<const float>> values,
                                std::vector<absl::Span<float>> mean, absl::Time deadline);
  // Sends a SparsePushPull of `step` with this shard's `k` entries (indices
  // and values of equal count). The reply's entries, at most `max_entries`,
  // will go to `result`, which must stay alive until Wait returns for the
  // id returned.
  absl::StatusOr<uint64_t> SendSparse(uint64_t step, uint32_t k,
                                      absl::Span<const uint32_t> indices,
                                      absl::Span<const float> values, SparseVector* result,
                                      uint64_t max_entries, absl::Time deadline);
  // Sends an AsyncPushPull of `step` with the gradient of the floats from
  // global index `offset` on. The reply's floats (the chunk's model) will go
  // to `model` (as many as `gradient`), which must stay alive until Wait
  // returns for the id returned.
  absl::StatusOr<uint64_t> SendAsync(uint64_t step, float lr, uint64_t offset,
                                     absl::Span<const float> gradient, absl::Span<float> model,
                                     absl::Time deadline);
  // Blocks until request `id`'s reply is in its mean; the shard's error for
  // the request, or the channel's.
  absl::Status Wait(uint64_t id, absl::Time deadline);
  // The members the shard's rounds waited for, as its newest mean's reply
  // said; 0 before the first.
  uint32_t members() const {
    absl::MutexLock lock(&mu_);
    return members_;
  }

  bool broken() const;
  const std::string& name() const { return name_; }

 private:
  struct Pending {
    const char* call = "PushPull";  // its errors' prefix
    std::vector<absl::Span<float>> mean;
    uint64_t count = 0;
    // A SparsePushPull's: where its reply goes, and how many entries it
    // may have; null for a PushPull.
    SparseVector* sparse = nullptr;
    uint64_t max_entries = 0;
    bool done = false;
    absl::Status status;
  };

  BulkChannel(std::unique_ptr<ByteStream> stream, std::string name)
      : stream_(std::move(stream)), name_(std::move(name)) {}
  // Registers `pending` under a new request id, which `encode` writes into
  // the frame's head (iov[0]), and sends the frame.
  absl::StatusOr<uint64_t> SendFrame(Pending pending, absl::Span<iovec> iov,
                                     const std::function<void(uint64_t id)>& encode,
                                     absl::Time deadline);
  // Reads one reply into its request's mean; an error breaks the channel.
  absl::Status ReadOne(absl::Time deadline);
  void Break(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The channel's error as `call`'s.
  absl::Status BrokenFor(const char* call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<ByteStream> stream_;
  const std::string name_;
  // Held while a request is written, so frames never interleave.
  absl::Mutex send_mu_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // One waiter reads at a time; the others wait for it.
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  // The request whose mean the reader is filling; 0: none yet.
  uint64_t reading_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // unprefixed
  uint32_t members_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_BULK_CHANNEL_H_
