// Linked into every test binary (tests/CMakeLists.txt, cserps_test).
//
// Where gRPC's poller cannot run in the background (Debian's gRPC 1.51 with
// its epoll1 poller), the callback API of every channel and server in the
// process shares one completion queue: the first user creates it, and the
// last to go shuts it down, joins its threads and deletes it. Tests that
// start and stop their servers and channels per case run that teardown
// between cases, and gRPC can race it: a double unref of the queue inside
// grpc_completion_queue_next, which AddressSanitizer reported in a run of
// server_service on a clean clone (docs/decisions.md). A server with a
// callback service, started before the first case and never stopped, holds
// the queue for the life of the process, so it is torn down at most once,
// at exit. The server listens on no port.
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace {

// Never deleted: deleting them could run the teardown this exists to avoid.
grpc::CallbackGenericService* g_service = nullptr;
grpc::Server* g_server = nullptr;

class CallbackQueueHold : public ::testing::Environment {
 public:
  void SetUp() override {
    if (g_server != nullptr) return;
    g_service = new grpc::CallbackGenericService;
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(g_service);
    g_server = builder.BuildAndStart().release();
    ASSERT_NE(g_server, nullptr) << "the server that holds gRPC's callback queue did not start";
  }
};

[[maybe_unused]] ::testing::Environment* const kHold =
    ::testing::AddGlobalTestEnvironment(new CallbackQueueHold);

}  // namespace
