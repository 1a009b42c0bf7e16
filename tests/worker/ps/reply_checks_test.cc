// A shard's replies are checked before the caller writes through them. The
// sparse exchange's: a shard that answers with an index outside its floats,
// or out of order (another layout's server, a corrupt reply), fails the
// exchange naming the shard, where the worker wrote outside its model.
// PullModel's: a reply of another size fails the call as DATA_LOSS naming
// the shard, and the model is left as it was.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sparse_vector.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kD = 100;

// Answers every SparsePushPull with `indices` (and as many values).
class ScriptedSparseShard final : public v1::SparseExchange::CallbackService {
 public:
  explicit ScriptedSparseShard(std::vector<uint32_t> indices) : indices_(std::move(indices)) {}

  grpc::ServerUnaryReactor* SparsePushPull(grpc::CallbackServerContext* context,
                                           const v1::SparsePushPullRequest* request,
                                           v1::SparsePushPullResponse* response) override {
    const std::vector<float> values(indices_.size(), 1.0f);
    response->set_step(request->step());
    response->set_indices(indices_.data(), indices_.size() * sizeof(uint32_t));
    response->set_values(values.data(), values.size() * sizeof(float));
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const std::vector<uint32_t> indices_;
};

absl::Status ExchangeWith(const std::vector<uint32_t>& answer) {
  ScriptedSparseShard shard(answer);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&shard);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::InternalError("no scripted shard");
  const v1::JobConfig config = testing::TestConfig(absl::StrCat(R"pb(
    name: "sparse-reply-test"
    cluster { servers: "127.0.0.1:)pb", port, R"pb(" num_workers: 2 transport: GRPC
              round_timeout_s: 10 }
    model { kind: FLAT num_params: )pb", kD, R"pb( }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "gtopk-ssgd" density: 0.05 }
    epochs: 1
  )pb"));
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(config, kD);
  if (!client.ok()) return client.status();
  SparseVector local, global;
  for (uint32_t i = 0; i < 5; ++i) {
    local.indices.push_back(i * 20);
    local.values.push_back(1.0f);
  }
  const absl::Status status = (*client)->ExchangeSparse(1, local, &global);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return status;
}

TEST(SparseReplyTest, AReplyInsideTheShardInOrderIsTaken) {
  EXPECT_TRUE(ExchangeWith({3, 40, 99}).ok());
}

TEST(SparseReplyTest, AnIndexOutsideTheShardFailsTheExchange) {
  const absl::Status status = ExchangeWith({3, 40, kD + 7});
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("shard 0 answered sparse step 1 with index ", kD + 7,
                                     " at position 2")));
}

TEST(SparseReplyTest, IndicesOutOfOrderFailTheExchange) {
  const absl::Status status = ExchangeWith({40, 3});
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("strictly ascending"));
}

// Answers every PullModel with one float fewer than it asked for.
class ShortModelShard final : public v1::ParameterServer::CallbackService {
  grpc::ServerUnaryReactor* PullModel(grpc::CallbackServerContext* context,
                                      const v1::PullModelRequest* request,
                                      v1::PullModelResponse* response) override {
    const std::vector<float> values(request->count() - 1, 1.0f);
    response->set_values(values.data(), values.size() * sizeof(float));
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(ModelReplyTest, AReplyOfAnotherSizeIsDataLossAndLeavesTheModel) {
  ShortModelShard shard;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&shard);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const v1::JobConfig config = testing::TestConfig(absl::StrCat(R"pb(
    name: "model-reply-test"
    cluster { servers: "127.0.0.1:)pb", port, R"pb(" num_workers: 1 transport: GRPC }
    model { kind: FLAT num_params: )pb", kD, R"pb( }
    data { batch_size: 1 }
    optimizer { lr: 0.1 }
    algorithm { name: "ssgd" }
    epochs: 1
  )pb"));
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(config, kD);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> model(kD, -2.0f);
  const absl::Status pulled = (*client)->PullModel(absl::MakeSpan(model), false);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(pulled)) << pulled;
  EXPECT_THAT(pulled.message(), HasSubstr(absl::StrCat("PullModel reply from shard 0 at 127.0.0.1:",
                                                       port)));
  EXPECT_THAT(model, ::testing::Each(-2.0f));
}

}  // namespace
}  // namespace cserps
