// The bulk transport's byte stream over one connected socket: plaintext
// (socket_io's calls) or TLS 1.3 (OpenSSL), with the same whole-message
// calls and errors (UNAVAILABLE, DEADLINE_EXCEEDED; naming `what`).
//
// One thread may receive while another sends. TLS keeps both directions in
// one SSL object, whose calls a mutex serialises; no call holds it while it
// waits for the socket (the socket is non-blocking: a call that would block
// lets go and polls).
#ifndef CSERPS_COMMON_BYTE_STREAM_H_
#define CSERPS_COMMON_BYTE_STREAM_H_

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/socket_io.h"
#include "common/transport_security.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace cserps {

// The TLS settings of one side, made once from the job's files: its own
// certificate and key, and the CA the peer's certificate must be signed by
// (a worker also checks that the shard's is valid for the shard's host).
// TLS 1.3 only.
class TlsContext {
 public:
  // `refused`, when not null, counts the client certificates the handshake
  // refused (the shard's bad_certificate metric).
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForServer(
      const TlsFiles& files, std::atomic<uint64_t>* refused);
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForClient(const TlsFiles& files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const { return ctx_; }
  bool server() const { return server_; }

 private:
  TlsContext(SSL_CTX* ctx, bool server) : ctx_(ctx), server_(server) {}
  SSL_CTX* const ctx_;
  const bool server_;
};

class ByteStream {
 public:
  static std::unique_ptr<ByteStream> Plain(Socket socket);
  // TLS on `socket`, its handshake still to come (Handshake). A worker's
  // `peer_host` (a name or an IP address) is the shard's, which its
  // certificate must be valid for; a shard's is empty.
  static absl::StatusOr<std::unique_ptr<ByteStream>> Tls(Socket socket, const TlsContext& tls,
                                                         const std::string& peer_host);
  // TLS's handshake, bounded by `deadline`; nothing for a plaintext stream.
  // UNAUTHENTICATED when this side refused the peer's certificate. (In TLS
  // 1.3 a client whose certificate the shard refuses learns it at its
  // first read, as a closed connection.)
  absl::Status Handshake(absl::Time deadline, absl::string_view what);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  int fd() const { return socket_.fd(); }
  bool tls() const { return ssl_ != nullptr; }

  // Sends every byte of `iov` (whose entries may be modified).
  absl::Status SendAll(absl::Span<iovec> iov, absl::Time deadline, absl::string_view what);
  // Plaintext only: sends what the socket takes now, without waiting.
  absl::StatusOr<size_t> SendSome(absl::Span<iovec> iov, absl::string_view what);
  // Fills every byte of `iov` (likewise).
  absl::Status RecvAll(absl::Span<iovec> iov, absl::Time deadline, absl::string_view what);
  absl::Status RecvAll(void* data, size_t size, absl::Time deadline, absl::string_view what) {
    iovec one{data, size};
    return RecvAll(absl::MakeSpan(&one, 1), deadline, what);
  }
  // socket_io's RecvNext: no deadline for the first bytes, `rest` after.
  absl::Status RecvNext(void* data, size_t size, absl::Duration rest, absl::string_view what);

 private:
  ByteStream(Socket socket, SSL* ssl) : socket_(std::move(socket)), ssl_(ssl) {}
  // Calls `call` (an OpenSSL call returning > 0 on success) until it
  // succeeds, waiting for the socket as OpenSSL asks; the failure, named.
  absl::Status Drive(absl::FunctionRef<int(SSL*)> call, absl::Time deadline,
                     absl::string_view what);
  // RecvAll over TLS; once some bytes came, the rest are due `once_begun`
  // later.
  absl::Status TlsRecv(absl::Span<iovec> iov, absl::Time deadline, absl::Duration once_begun,
                       absl::string_view what);

  const Socket socket_;
  // Held for each call into ssl_, never while waiting for the socket.
  absl::Mutex ssl_mu_;
  SSL* const ssl_ ABSL_PT_GUARDED_BY(ssl_mu_);  // null: plaintext
};

}  // namespace cserps

#endif  // CSERPS_COMMON_BYTE_STREAM_H_
