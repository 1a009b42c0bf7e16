#include "common/transport_security.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/openssl_pem.h"
#include "common/status.h"

namespace cserps {
namespace {

struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};

absl::StatusOr<std::string> ReadNamedFile(absl::string_view field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("security.", field, " ", path,
                                            " cannot be read: ", std::strerror(errno)));
  }
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("security.", field, " ", path, ": read failed"));
  }
  if (contents.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("security.", field, " ", path, " is empty"));
  }
  return contents;
}

absl::Status CheckTls(const v1::SecurityConfig& config, const TlsFiles& files, TlsRole role) {
  auto invalid = [](absl::string_view field, const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("security.", field, " ", path, ": ", what));
  };
  if (ReadPemCertificates(files.ca_pem).empty()) {
    return invalid("ca_cert", config.ca_cert(), "holds no PEM certificate");
  }
  std::vector<X509Ptr> chain = ReadPemCertificates(files.cert_pem);
  if (chain.empty()) return invalid("cert", config.cert(), "holds no PEM certificate");
  KeyPtr key = ReadPemPrivateKey(files.key_pem);
  if (key == nullptr) {
    return invalid("key", config.key(),
                   absl::StrCat("not an unencrypted PEM private key (", OpenSslReason(), ")"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return invalid("key", config.key(),
                   absl::StrCat("does not match the certificate security.cert ", config.cert()));
  }
  absl::Status signed_by_ca = VerifyCertificate(files.ca_pem, files.cert_pem);
  if (!signed_by_ca.ok()) {
    return invalid("cert", config.cert(),
                   absl::StrCat("is not accepted by security.ca_cert ", config.ca_cert(), ": ",
                                signed_by_ca.message()));
  }
  const bool server = role == TlsRole::kServer;
  if (X509_check_purpose(chain.front().get(),
                         server ? X509_PURPOSE_SSL_SERVER : X509_PURPOSE_SSL_CLIENT, 0) != 1) {
    ERR_clear_error();
    return invalid("cert", config.cert(),
                   absl::StrCat("is not a certificate for a ", server ? "server" : "worker",
                                " (its extendedKeyUsage lacks ",
                                server ? "serverAuth" : "clientAuth", "): tools/make_certs.sh "
                                "makes server.pem for servers and client.pem for workers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadNamedFile("token_file", path));
  std::string token(absl::StripAsciiWhitespace(contents.substr(0, contents.find('\n'))));
  for (char c : token) {
    // Metadata values are printable ASCII; a space would be trimmed by some
    // clients and not by others.
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "security.token_file ", path,
          ": the token (the first line) must be printable ASCII without spaces"));
    }
  }
  if (token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security.token_file ", path, ": the token (the first line) has ", token.size(),
        " characters; at least ", kMinTokenLength, " are needed (tools/make_certs.sh makes one)"));
  }
  return token;
}

}  // namespace

absl::StatusOr<TransportSecurity> LoadTransportSecurity(const v1::SecurityConfig& config,
                                                        TlsRole role) {
  TransportSecurity security;
  const int tls_fields = !config.ca_cert().empty() + !config.cert().empty() +
                         !config.key().empty();
  if (tls_fields != 0 && tls_fields != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "security: TLS needs ca_cert, cert and key together; missing:",
        config.ca_cert().empty() ? " ca_cert" : "", config.cert().empty() ? " cert" : "",
        config.key().empty() ? " key" : ""));
  }
  if (tls_fields == 3) {
    TlsFiles files;
    ASSIGN_OR_RETURN(files.ca_pem, ReadNamedFile("ca_cert", config.ca_cert()));
    ASSIGN_OR_RETURN(files.cert_pem, ReadNamedFile("cert", config.cert()));
    ASSIGN_OR_RETURN(files.key_pem, ReadNamedFile("key", config.key()));
    RETURN_IF_ERROR(CheckTls(config, files, role));
    security.tls = std::move(files);
  }
  if (!config.token_file().empty()) {
    ASSIGN_OR_RETURN(security.token, LoadToken(config.token_file()));
  }
  return security;
}

absl::Status VerifyCertificate(absl::string_view ca_pem, absl::string_view chain_pem) {
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (const auto& ca : ReadPemCertificates(ca_pem)) X509_STORE_add_cert(store.get(), ca.get());
  std::vector<X509Ptr> chain = ReadPemCertificates(chain_pem);
  if (chain.empty()) return absl::UnauthenticatedError("no certificate");
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> intermediates(
      sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_free(s); });
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(intermediates.get(), chain[i].get());
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> verify(X509_STORE_CTX_new());
  X509_STORE_CTX_init(verify.get(), store.get(), chain.front().get(), intermediates.get());
  if (X509_verify_cert(verify.get()) != 1) {
    const int error = X509_STORE_CTX_get_error(verify.get());
    ERR_clear_error();
    return absl::UnauthenticatedError(X509_verify_cert_error_string(error));
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::string_view host = address.substr(0, address.rfind(':'));
  if (host == "localhost" || host == "[::1]") return true;
  unsigned char ip[4];
  return absl::StartsWith(host, "127.") &&
         inet_pton(AF_INET, std::string(host).c_str(), ip) == 1;
}

absl::Status CheckExposure(absl::string_view listen_address,
                           const v1::SecurityConfig& config, bool insecure) {
  if (insecure || IsLoopbackAddress(listen_address)) return absl::OkStatus();
  const bool tls = !config.ca_cert().empty() && !config.cert().empty() && !config.key().empty();
  const bool token = !config.token_file().empty();
  if (tls && token) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to listen on ", listen_address, ", which is not a loopback address, without ",
      !tls && !token ? "TLS and a token" : (tls ? "a token" : "TLS"),
      ": anyone who reaches the port could ", token ? "read the model and the token on the wire"
                                                    : "register, push into the model and read it",
      ". Set security { ca_cert cert key token_file } (tools/make_certs.sh makes them), "
      "listen on 127.0.0.1, or pass --insecure on a network you trust"));
}

bool TokenMatches(absl::string_view expected, absl::string_view given) {
  unsigned char a[SHA256_DIGEST_LENGTH];
  unsigned char b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

absl::Status CheckToken(absl::string_view expected, std::optional<absl::string_view> given,
                        absl::string_view carrier, absl::string_view where) {
  if (expected.empty()) return absl::OkStatus();
  if (!given.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        carrier, " carries no job token (", where,
        "): this server requires the job's security.token_file"));
  }
  if (!TokenMatches(expected, *given)) {
    return absl::UnauthenticatedError(absl::StrCat(
        carrier, "'s job token is not this job's (security.token_file differs)"));
  }
  return absl::OkStatus();
}

}  // namespace cserps
