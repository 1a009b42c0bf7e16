#include "common/byte_stream.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/openssl_pem.h"
#include "common/status.h"

namespace cserps {
namespace {

// OpenSSL reads the socket this much at a time, so that a record does not
// cost a recv of its own.
constexpr int kReadBufferBytes = 256 << 10;
// TLS's largest record: the small pieces of a message (headers) are sent in
// one record with the start of what follows them.
constexpr size_t kRecordBytes = 16 << 10;

int RefusedCounterIndex() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

// Counts a client certificate whose chain the shard refuses. It runs before
// the handshake's alert leaves, so a client that has seen its refusal sees
// it counted.
int CountRefusal(int ok, X509_STORE_CTX* store) {
  if (ok == 1) return 1;
  SSL* ssl = static_cast<SSL*>(
      X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* refused = static_cast<std::atomic<uint64_t>*>(
      SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), RefusedCounterIndex()));
  if (refused != nullptr) refused->fetch_add(1, std::memory_order_relaxed);
  return 0;
}

absl::StatusOr<SSL_CTX*> NewContext(const TlsFiles& files, bool server) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS: ", OpenSslReason()));
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> owned(ctx, SSL_CTX_free);
  std::vector<X509Ptr> chain = ReadPemCertificates(files.cert_pem);
  KeyPtr key = ReadPemPrivateKey(files.key_pem);
  if (chain.empty() || key == nullptr) {
    return absl::InvalidArgumentError("TLS: the certificate or key holds no PEM data");
  }
  bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
            SSL_CTX_use_certificate(ctx, chain.front().get()) == 1 &&
            SSL_CTX_use_PrivateKey(ctx, key.get()) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  for (size_t i = 1; ok && i < chain.size(); ++i) {
    ok = SSL_CTX_add1_chain_cert(ctx, chain[i].get()) == 1;
  }
  std::vector<X509Ptr> cas = ReadPemCertificates(files.ca_pem);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  for (size_t i = 0; ok && i < cas.size(); ++i) ok = X509_STORE_add_cert(store, cas[i].get()) == 1;
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("TLS: ", OpenSslReason()));
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Frames carry their lengths, so a connection cut short is seen without
  // TLS's close_notify (peers just close).
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, kReadBufferBytes);
  if (server) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, CountRefusal);
    // Tickets would wait unread: workers never resume a session.
    SSL_CTX_set_num_tickets(ctx, 0);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  return owned.release();
}

// What the failed call that returned `result` on `ssl` means: OK with the
// socket events to wait for, or the error. Call at once, on the same thread.
absl::Status Classify(SSL* ssl, int result, short* events, absl::string_view what) {
  const int error = SSL_get_error(ssl, result);
  switch (error) {
    case SSL_ERROR_WANT_READ:
      *events = POLLIN;
      return absl::OkStatus();
    case SSL_ERROR_WANT_WRITE:
      *events = POLLOUT;
      return absl::OkStatus();
    case SSL_ERROR_ZERO_RETURN:
      return absl::UnavailableError(absl::StrCat(what, ": connection closed by the peer"));
    case SSL_ERROR_SYSCALL:
      if (errno == 0) {
        return absl::UnavailableError(absl::StrCat(what, ": connection closed by the peer"));
      }
      return absl::UnavailableError(absl::StrCat(what, ": TLS: ", std::strerror(errno)));
    default:
      break;
  }
  std::string reason = absl::StrCat(what, ": TLS: ", OpenSslReason());
  const long verified = SSL_get_verify_result(ssl);  // NOLINT(runtime/int): OpenSSL's type
  if (verified != X509_V_OK) {
    return absl::UnauthenticatedError(
        absl::StrCat(reason, "; the peer's certificate: ",
                     X509_verify_cert_error_string(verified)));
  }
  return absl::UnavailableError(reason);
}

// OpenSSL's socket BIO writes with write(), which raises SIGPIPE on a
// connection the peer has reset; this one sends with MSG_NOSIGNAL, as
// socket_io does, so a dead peer is an error, not the end of the process.
int SocketWrite(BIO* bio, const char* data, int size) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  const ssize_t n = send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(bio);
  }
  return static_cast<int>(n);
}

int SocketRead(BIO* bio, char* data, int size) {
  BIO_clear_retry_flags(bio);
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(bio)));
  const ssize_t n = recv(fd, data, static_cast<size_t>(size), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(bio);
  }
  return static_cast<int>(n);
}

long SocketControl(BIO* /*bio*/, int command, long /*num*/,  // NOLINT(runtime/int): OpenSSL's
                   void* /*ptr*/) {
  return command == BIO_CTRL_FLUSH ? 1 : 0;  // writes are never buffered here
}

int SocketCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static const BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "cserps socket");
    BIO_meth_set_write(m, SocketWrite);
    BIO_meth_set_read(m, SocketRead);
    BIO_meth_set_ctrl(m, SocketControl);
    BIO_meth_set_create(m, SocketCreate);
    return m;
  }();
  return method;
}

bool IsIpAddress(const std::string& host) {
  unsigned char ip[16];
  return inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForServer(
    const TlsFiles& files, std::atomic<uint64_t>* refused) {
  ASSIGN_OR_RETURN(SSL_CTX * ctx, NewContext(files, /*server=*/true));
  SSL_CTX_set_ex_data(ctx, RefusedCounterIndex(), refused);
  return std::shared_ptr<TlsContext>(new TlsContext(ctx, /*server=*/true));
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForClient(const TlsFiles& files) {
  ASSIGN_OR_RETURN(SSL_CTX * ctx, NewContext(files, /*server=*/false));
  return std::shared_ptr<TlsContext>(new TlsContext(ctx, /*server=*/false));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<ByteStream> ByteStream::Plain(Socket socket) {
  return std::unique_ptr<ByteStream>(new ByteStream(std::move(socket), nullptr));
}

absl::StatusOr<std::unique_ptr<ByteStream>> ByteStream::Tls(Socket socket,
                                                            const TlsContext& tls,
                                                            const std::string& peer_host) {
  SSL* ssl = SSL_new(tls.get());
  BIO* bio = BIO_new(SocketMethod());
  bool ok = ssl != nullptr && bio != nullptr;
  if (ok) {
    BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(socket.fd())));
    SSL_set_bio(ssl, bio, bio);  // the SSL owns it (one reference for both directions)
  } else {
    BIO_free(bio);
  }
  if (ok && !tls.server() && IsIpAddress(peer_host)) {
    ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), peer_host.c_str()) == 1;
  } else if (ok && !tls.server()) {
    ok = SSL_set1_host(ssl, peer_host.c_str()) == 1 &&
         SSL_set_tlsext_host_name(ssl, peer_host.c_str()) == 1;
  }
  if (!ok) {
    SSL_free(ssl);
    return absl::InternalError(absl::StrCat("TLS: ", OpenSslReason()));
  }
  if (tls.server()) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  return std::unique_ptr<ByteStream>(new ByteStream(std::move(socket), ssl));
}

absl::Status ByteStream::Handshake(absl::Time deadline, absl::string_view what) {
  if (ssl_ == nullptr) return absl::OkStatus();
  return Drive([](SSL* s) { return SSL_do_handshake(s); }, deadline, what);
}

ByteStream::~ByteStream() { SSL_free(ssl_); }

absl::Status ByteStream::Drive(absl::FunctionRef<int(SSL*)> call, absl::Time deadline,
                               absl::string_view what) {
  for (;;) {
    short events = 0;
    {
      absl::MutexLock lock(&ssl_mu_);
      ERR_clear_error();
      errno = 0;
      const int result = call(ssl_);
      if (result > 0) return absl::OkStatus();
      RETURN_IF_ERROR(Classify(ssl_, result, &events, what));
    }
    RETURN_IF_ERROR(WaitFor(fd(), events, deadline, what));
  }
}

absl::Status ByteStream::SendAll(absl::Span<iovec> iov, absl::Time deadline,
                                 absl::string_view what) {
  if (ssl_ == nullptr) return cserps::SendAll(fd(), iov, deadline, what);
  char record[kRecordBytes];
  size_t staged = 0;
  auto write = [&](const char* data, size_t size) -> absl::Status {
    while (size > 0) {
      size_t sent = 0;
      RETURN_IF_ERROR(Drive([&](SSL* s) { return SSL_write_ex(s, data, size, &sent); }, deadline,
                            what));
      data += sent;
      size -= sent;
    }
    return absl::OkStatus();
  };
  for (const iovec& piece : iov) {
    const char* data = static_cast<const char*>(piece.iov_base);
    size_t left = piece.iov_len;
    while (left > 0) {
      if (staged == 0 && left >= kRecordBytes) {
        RETURN_IF_ERROR(write(data, left));
        break;
      }
      const size_t n = std::min(left, kRecordBytes - staged);
      std::memcpy(record + staged, data, n);
      staged += n;
      data += n;
      left -= n;
      if (staged == kRecordBytes) {
        RETURN_IF_ERROR(write(record, staged));
        staged = 0;
      }
    }
  }
  return write(record, staged);
}

absl::StatusOr<size_t> ByteStream::SendSome(absl::Span<iovec> iov, absl::string_view what) {
  if (ssl_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": SendSome on a TLS stream"));
  }
  return cserps::SendSome(fd(), iov, what);
}

absl::Status ByteStream::RecvAll(absl::Span<iovec> iov, absl::Time deadline,
                                 absl::string_view what) {
  if (ssl_ == nullptr) return cserps::RecvAll(fd(), iov, deadline, what);
  return TlsRecv(iov, deadline, absl::InfiniteDuration(), what);
}

absl::Status ByteStream::RecvNext(void* data, size_t size, absl::Duration rest,
                                  absl::string_view what) {
  iovec one{data, size};
  if (ssl_ == nullptr) return cserps::RecvNext(fd(), absl::MakeSpan(&one, 1), rest, what);
  return TlsRecv(absl::MakeSpan(&one, 1), absl::InfiniteFuture(), rest, what);
}

absl::Status ByteStream::TlsRecv(absl::Span<iovec> iov, absl::Time deadline,
                                 absl::Duration once_begun, absl::string_view what) {
  for (const iovec& piece : iov) {
    char* data = static_cast<char*>(piece.iov_base);
    size_t left = piece.iov_len;
    while (left > 0) {
      size_t got = 0;
      RETURN_IF_ERROR(
          Drive([&](SSL* s) { return SSL_read_ex(s, data, left, &got); }, deadline, what));
      data += got;
      left -= got;
      if (once_begun != absl::InfiniteDuration()) {
        deadline = std::min(deadline, absl::Now() + once_begun);
        once_begun = absl::InfiniteDuration();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace cserps
