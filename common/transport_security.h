// The files a process's SecurityConfig names, read and checked before any
// socket opens (docs/security.md): TLS's CA, certificate and key in PEM, and
// the job's token. Each failure names the field, the path and what is wrong
// with it: missing or unreadable, not PEM, a certificate that does not match
// its key, is not signed by the CA (or has expired) or is not for the
// process's end of the connections, a token too short or not printable.
#ifndef CSERPS_COMMON_TRANSPORT_SECURITY_H_
#define CSERPS_COMMON_TRANSPORT_SECURITY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

struct TlsFiles {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

struct TransportSecurity {
  std::optional<TlsFiles> tls;  // none: plaintext
  std::string token;            // empty: no token
  bool enabled() const { return tls.has_value() || !token.empty(); }
};

// The call metadata that carries the token.
inline constexpr char kTokenMetadataKey[] = "x-cserps-token";
// Shorter tokens are refused: a token is a secret, not a password to type.
inline constexpr size_t kMinTokenLength = 16;

// Which end of the job's connections a process is: its certificate must be
// one for it (extendedKeyUsage serverAuth, or clientAuth for a worker), or
// the other end's handshake refuses it.
enum class TlsRole { kServer, kWorker };

// Empty fields load nothing; ca_cert, cert and key go together.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const v1::SecurityConfig& config,
                                                        TlsRole role);

// OK when the first certificate of `chain_pem` (the others: intermediates)
// is signed by a certificate of `ca_pem` and valid now; UNAUTHENTICATED
// with OpenSSL's reason otherwise.
absl::Status VerifyCertificate(absl::string_view ca_pem, absl::string_view chain_pem);

// Whether "host:port" names a loopback host: 127.0.0.0/8, [::1] or
// localhost. An empty host, 0.0.0.0, [::] and any other name are not.
bool IsLoopbackAddress(absl::string_view address);

// OK when `listen_address` is loopback, when `config` has TLS and a token,
// or when `insecure` (the operator said so); otherwise FAILED_PRECONDITION
// saying which is missing and how to proceed.
absl::Status CheckExposure(absl::string_view listen_address,
                           const v1::SecurityConfig& config, bool insecure);

// Whether `given` equals `expected`, in time that depends on neither's
// contents (their SHA-256 digests are compared with CRYPTO_memcmp), so that
// a caller cannot find the token byte by byte.
bool TokenMatches(absl::string_view expected, absl::string_view given);

// OK when the job has no token (`expected` empty) or `given` is it;
// otherwise UNAUTHENTICATED saying whether `carrier` ("the call") carried
// none (`given` empty; `where` says where it belongs) or another.
absl::Status CheckToken(absl::string_view expected, std::optional<absl::string_view> given,
                        absl::string_view carrier, absl::string_view where);

}  // namespace cserps

#endif  // CSERPS_COMMON_TRANSPORT_SECURITY_H_
