// libFuzzer target: request validation of a live shard. Three one-worker
// jobs (ssgd, gtopk-ssgd, async-sgd) run in this process on 127.0.0.1,
// registered and initialised; each input is a PushPull, SparsePushPull or
// AsyncPushPull request (the first byte picks which and whether the
// fingerprint and rank are left as the input says or made the job's), sent
// over gRPC with a deadline. The shard must answer every one, whatever it
// holds, and keep serving.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cserps/v1/parameter_server.grpc.pb.h"
#include "tests/fuzz/live_shard.h"

namespace cserps {
namespace {

// A live shard (live_shard.h) and stubs of its three services.
struct Shard {
  LiveShard* live = nullptr;
  std::unique_ptr<v1::ParameterServer::Stub> dense;
  std::unique_ptr<v1::SparseExchange::Stub> sparse;
  std::unique_ptr<v1::AsyncParameterServer::Stub> async;
};

Shard* StartShard(const std::string& algorithm) {
  auto* shard = new Shard();  // lives as long as the fuzzer
  shard->live = StartLiveShard(algorithm);
  auto channel =
      grpc::CreateChannel(shard->live->server->address(), grpc::InsecureChannelCredentials());
  shard->dense = v1::ParameterServer::NewStub(channel);
  shard->sparse = v1::SparseExchange::NewStub(channel);
  shard->async = v1::AsyncParameterServer::NewStub(channel);
  return shard;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

// Sends the input, parsed as a `Request`, through `call`; with the job's
// fingerprint and rank 0 unless `mode` says to keep the input's. Nothing
// when it does not parse.
template <typename Stub, typename Request, typename Response>
std::optional<grpc::Status> Send(Stub& stub,
                                 grpc::Status (Stub::*call)(grpc::ClientContext*, const Request&,
                                                            Response*),
                                 const uint8_t* data, size_t size, uint8_t mode,
                                 uint64_t fingerprint) {
  Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return std::nullopt;
  if (!(mode & 0x40)) request.set_fingerprint(fingerprint);
  if (!(mode & 0x80)) request.set_rank(0);
  grpc::ClientContext context;
  SetDeadline(&context);
  Response response;
  return (stub.*call)(&context, request, &response);
}

}  // namespace
}  // namespace cserps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cserps;  // NOLINT(build/namespaces): a fuzz entry point
  static Shard* const dense = StartShard("name: 'ssgd'");
  static Shard* const sparse = StartShard("name: 'gtopk-ssgd' density: 0.1");
  static Shard* const async = StartShard("name: 'async-sgd'");
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  std::optional<grpc::Status> status;
  switch (mode % 3) {
    case 0:
      status = Send(*dense->dense, &v1::ParameterServer::Stub::PushPull, data, size, mode,
                    dense->live->fingerprint);
      break;
    case 1:
      status = Send(*sparse->sparse, &v1::SparseExchange::Stub::SparsePushPull, data, size, mode,
                    sparse->live->fingerprint);
      break;
    default:
      status = Send(*async->async, &v1::AsyncParameterServer::Stub::AsyncPushPull, data, size,
                    mode, async->live->fingerprint);
      break;
  }
  if (!status.has_value()) return 0;
  // The shard answered (any code but the deadline's, which would mean it
  // held the call) and still serves.
  if (status->error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) std::abort();
  if (!dense->live->client->GetStatus(0).ok()) std::abort();
  return 0;
}
