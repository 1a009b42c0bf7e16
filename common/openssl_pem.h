// Owned OpenSSL objects and the PEM reading that cserps' TLS code shares
// (the files' checks and the bulk transport's TLS contexts).
#ifndef CSERPS_COMMON_OPENSSL_PEM_H_
#define CSERPS_COMMON_OPENSSL_PEM_H_

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace cserps {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

// The certificates of a PEM bundle, in order; none when it holds none.
std::vector<X509Ptr> ReadPemCertificates(absl::string_view pem);
// The unencrypted private key of `pem`; null when it holds none (an
// encrypted one is not read: no passphrase is asked for).
KeyPtr ReadPemPrivateKey(absl::string_view pem);
// The reason OpenSSL gave for the last failure ("no PEM data" when none),
// and its queue emptied.
std::string OpenSslReason();

}  // namespace cserps

#endif  // CSERPS_COMMON_OPENSSL_PEM_H_
