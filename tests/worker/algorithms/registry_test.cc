// MakeAlgorithm (worker/algorithms/registry.h) against the registry of
// common/algorithm_catalog.h: every entry has an implementation that is made
// and initialised, and an unknown name is NOT_FOUND listing the known ones.
// Nothing is sent: the client's address is never dialled.
#include "worker/algorithms/registry.h"

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/algorithm_catalog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/algorithms/algorithm_harness.h"
#include "worker/device/host_device_ops.h"
#include "worker/ps/ps_client.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

// The parameters each algorithm reads, so that its config is valid.
const std::map<std::string, std::string>& Parameters() {
  static const auto* const parameters = new std::map<std::string, std::string>{
      {"async-sgd", "staleness: 1"},
      {"cocod-sgd", "period: 2"},
      {"csea", "ratio_c1: 4"},
      {"cser", "period: 2 ratio_c1: 4 ratio_c2: 8"},
      {"cser-pl", "period: 2 ratio_c1: 4"},
      {"ef-sgd", "ratio: 4"},
      {"gtopk-ssgd", "density: 0.1"},
      {"local-sgd", "period: 2"},
      {"m-cser", "period: 2 ratio_c1: 4 ratio_c2: 8"},
      {"pipe-sgd", ""},
      {"qsparse-local-sgd", "period: 2 ratio: 4"},
      {"ssgd", ""},
      {"topk-ssgd", "density: 0.1"},
  };
  return *parameters;
}

// The algorithm of `config` on `ops`, with `client` as its communicator.
absl::StatusOr<std::unique_ptr<Algorithm>> Make(const v1::JobConfig& config, PsClient* client,
                                                HostDeviceOps& ops) {
  AlgorithmContext context;
  context.config = &config;
  context.comm = client;
  context.ops = &ops;
  return MakeAlgorithm(context);
}

TEST(RegistryTest, EveryCatalogEntryIsMade) {
  for (const AlgorithmInfo& info : KnownAlgorithms()) {
    SCOPED_TRACE(info.name);
    const auto parameters = Parameters().find(info.name);
    ASSERT_NE(parameters, Parameters().end()) << "no parameters for a new algorithm";
    v1::JobConfig config = testing::MakeJobConfig(
        absl::StrCat("name: \"", info.name, "\" ", parameters->second),
        info.needs_nesterov ? "lr: 0.1 momentum_kind: NESTEROV momentum: 0.9" : "lr: 0.1",
        {1, 2});
    config.mutable_cluster()->set_servers(0, "127.0.0.1:1");
    config.mutable_cluster()->set_servers(1, "127.0.0.1:1");
    ASSERT_TRUE(ValidateAlgorithm(config.algorithm(), config.optimizer()).ok());
    const absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(config, testing::NumParams(config));
    ASSERT_TRUE(client.ok()) << client.status();
    HostDeviceOps ops(testing::NumParams(config), config.algorithm().block_size());
    const absl::StatusOr<std::unique_ptr<Algorithm>> algorithm =
        Make(config, client->get(), ops);
    EXPECT_TRUE(algorithm.ok()) << algorithm.status();
  }
}

TEST(RegistryTest, AnUnknownNameIsNotFoundListingTheKnownNames) {
  v1::JobConfig config = testing::MakeJobConfig(R"(name: "sgd")", "lr: 0.1", {1});
  const absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(config, testing::NumParams(config));
  ASSERT_TRUE(client.ok()) << client.status();
  HostDeviceOps ops(testing::NumParams(config), config.algorithm().block_size());
  const absl::StatusOr<std::unique_ptr<Algorithm>> algorithm =
      Make(config, client->get(), ops);
  EXPECT_EQ(algorithm.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(algorithm.status().message()),
              HasSubstr("unknown algorithm \"sgd\""));
  for (const AlgorithmInfo& info : KnownAlgorithms()) {
    EXPECT_THAT(std::string(algorithm.status().message()), HasSubstr(info.name));
  }
}

}  // namespace
}  // namespace cserps
