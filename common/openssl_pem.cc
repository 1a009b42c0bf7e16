#include "common/openssl_pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>

namespace cserps {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(absl::string_view pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

}  // namespace

std::vector<X509Ptr> ReadPemCertificates(absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio = MemoryBio(pem);
  std::vector<X509Ptr> out;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    out.emplace_back(cert);
  }
  ERR_clear_error();  // the end of the bundle reads as an error
  return out;
}

KeyPtr ReadPemPrivateKey(absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio = MemoryBio(pem);
  // Without a callback OpenSSL asks for an encrypted key's passphrase on
  // the terminal or stdin, where a server waits for it forever.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return -1; };
  return KeyPtr(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
}

std::string OpenSslReason() {
  const unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

}  // namespace cserps
