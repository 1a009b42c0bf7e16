#include "common/grpc_security.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/support/client_interceptor.h>

#include <atomic>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cserps {
namespace {

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* token) : token_(*token) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kTokenMetadataKey, token_);
    }
    methods->Proceed();
  }

 private:
  const std::string& token_;  // the factory's, which the channel keeps
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : token_(std::move(token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(&token_);
  }

 private:
  const std::string token_;
};

// Verifies a client's certificate against the job's CA after the handshake,
// so that a refused one is counted; gRPC's own check (which this replaces:
// the server asks for a certificate but leaves its chain to this) would fail
// the handshake unseen.
class ClientCertificateVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  ClientCertificateVerifier(std::string ca_pem, std::atomic<uint64_t>* refused)
      : ca_pem_(std::move(ca_pem)), refused_(refused) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> /*callback*/,
              grpc::Status* sync_status) override {
    grpc::string_ref chain = request->peer_cert_full_chain();
    if (chain.empty()) chain = request->peer_cert();
    const absl::Status verified =
        VerifyCertificate(ca_pem_, absl::string_view(chain.data(), chain.size()));
    if (verified.ok()) {
      *sync_status = grpc::Status::OK;
    } else {
      if (refused_ != nullptr) refused_->fetch_add(1, std::memory_order_relaxed);
      *sync_status = grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("the client certificate is not signed by the job's CA (security.ca_cert): ",
                       verified.message()));
    }
    return true;  // done synchronously
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest* /*request*/) override {}

 private:
  const std::string ca_pem_;
  std::atomic<uint64_t>* const refused_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TransportSecurity& security, std::atomic<uint64_t>* refused_certificates) {
  if (!security.tls.has_value()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      security.tls->ca_pem,
      std::vector<grpc::experimental::IdentityKeyCertPair>{
          {security.tls->key_pem, security.tls->cert_pem}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<ClientCertificateVerifier>(
          security.tls->ca_pem, refused_certificates));
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const TransportSecurity& security,
                                           const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (security.tls.has_value()) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = security.tls->ca_pem;
    options.pem_private_key = security.tls->key_pem;
    options.pem_cert_chain = security.tls->cert_pem;
    credentials = grpc::SslCredentials(options);
  }
  if (security.token.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(factories));
}

absl::Status CheckCallToken(const grpc::ServerContextBase& context,
                            absl::string_view expected) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kTokenMetadataKey);
  std::optional<absl::string_view> given;
  if (found != metadata.end()) given = absl::string_view(found->second.data(), found->second.size());
  return CheckToken(expected, given, "the call", absl::StrCat("metadata ", kTokenMetadataKey));
}

}  // namespace cserps
