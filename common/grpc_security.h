// gRPC's side of a TransportSecurity: server credentials that require and
// verify client certificates, channels that verify the server and send the
// job's token with every call, and the servers' check of that token.
#ifndef CSERPS_COMMON_GRPC_SECURITY_H_
#define CSERPS_COMMON_GRPC_SECURITY_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/transport_security.h"

namespace cserps {

// Insecure credentials when `security` has no TLS. With TLS, a client must
// present a certificate signed by the CA; each one refused is counted in
// `refused_certificates` (when not null; it outlives the credentials).
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TransportSecurity& security, std::atomic<uint64_t>* refused_certificates);

// A channel to `address` that verifies the server's certificate against the
// CA and presents this process's (with TLS), and adds the token to every
// call's metadata (with a token).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const TransportSecurity& security,
                                           const grpc::ChannelArguments& args);

// OK when `expected` is empty or the call carries it; UNAUTHENTICATED
// naming which (no token, a wrong one) otherwise.
absl::Status CheckCallToken(const grpc::ServerContextBase& context,
                            absl::string_view expected);

}  // namespace cserps

#endif  // CSERPS_COMMON_GRPC_SECURITY_H_
