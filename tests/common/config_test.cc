#include "common/config.h"

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/model_spec.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"

namespace cserps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A valid config built field by field, independent of the text parser.
v1::JobConfig ValidConfig() {
  v1::JobConfig config;
  config.set_name("test");
  config.set_seed(42);
  config.mutable_cluster()->add_servers("127.0.0.1:5000");
  config.mutable_cluster()->add_servers("127.0.0.1:5001");
  config.mutable_cluster()->set_num_workers(4);
  config.mutable_model()->set_kind(v1::ModelConfig::MLP);
  config.mutable_model()->add_hidden(64);
  config.mutable_data()->set_batch_size(32);
  config.mutable_optimizer()->set_lr(0.1f);
  config.mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::NESTEROV);
  config.mutable_optimizer()->set_momentum(0.9f);
  config.mutable_optimizer()->set_weight_decay(1e-4f);
  config.mutable_optimizer()->set_schedule(v1::OptimizerConfig::WARMUP_COSINE);
  config.mutable_optimizer()->set_warmup_epochs(0.5f);
  config.set_epochs(3);
  ApplyDefaults(&config);
  return config;
}

std::string MakeTempDir() {
  std::string pattern = testing::TempDir() + "/config_test_XXXXXX";
  char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

// ---------------------------------------------------------------------------
// Parsing and loading

TEST(ParseJobConfigTest, ParsesFields) {
  absl::StatusOr<v1::JobConfig> config = ParseJobConfig(
      "name: \"job\"\n"
      "seed: 9\n"
      "cluster { servers: \"h:1\" servers: \"h:2\" num_workers: 3 }\n"
      "model { kind: MLP hidden: 10 hidden: 20 }\n"
      "optimizer { lr: 0.25 momentum_kind: HEAVY_BALL }\n",
      "job.textproto");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name(), "job");
  EXPECT_EQ(config->seed(), 9u);
  EXPECT_THAT(config->cluster().servers(), ElementsAre("h:1", "h:2"));
  EXPECT_EQ(config->cluster().num_workers(), 3u);
  EXPECT_EQ(config->model().kind(), v1::ModelConfig::MLP);
  EXPECT_THAT(config->model().hidden(), ElementsAre(10u, 20u));
  EXPECT_EQ(config->optimizer().lr(), 0.25f);
  EXPECT_EQ(config->optimizer().momentum_kind(),
            v1::OptimizerConfig::HEAVY_BALL);
}

TEST(ParseJobConfigTest, SyntaxErrorNamesSourceLineAndColumn) {
  const std::string bad_line = "cluster { num_workers: x }";
  const std::string text = "name: \"a\"\nseed: 1\n" + bad_line + "\n";
  absl::StatusOr<v1::JobConfig> config = ParseJobConfig(text, "bad.textproto");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  // The offending token 'x' is on line 3; 1-based column of it.
  const size_t column = bad_line.find('x') + 1;
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith(absl::StrCat("bad.textproto:3:", column, ": ")));
}

TEST(ParseJobConfigTest, UnknownFieldIsNamed) {
  absl::StatusOr<v1::JobConfig> config =
      ParseJobConfig("seed: 1\n\noptimizer {\n  lrr: 0.1\n}\n", "x.textproto");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith("x.textproto:4:"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("\"lrr\""));
}

TEST(ParseJobConfigTest, RepeatedSingularFieldIsAnError) {
  absl::StatusOr<v1::JobConfig> config =
      ParseJobConfig("seed: 1\nseed: 2\n", "dup.textproto");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith("dup.textproto:2:"));
}

TEST(LoadJobConfigTest, MissingFileIsNotFoundNamingPath) {
  const std::string path = MakeTempDir() + "/no-such.textproto";
  absl::StatusOr<v1::JobConfig> config = LoadJobConfig(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST(LoadJobConfigTest, ReadsFileAndUsesPathAsSourceName) {
  const std::string dir = MakeTempDir();
  const std::string good = dir + "/good.textproto";
  const std::string bad = dir + "/bad.textproto";
  std::ofstream(good) << "name: \"from-file\"\nepochs: 5\n";
  std::ofstream(bad) << "epochs: 5\nepochs 5 5\n";

  absl::StatusOr<v1::JobConfig> config = LoadJobConfig(good);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name(), "from-file");
  EXPECT_EQ(config->epochs(), 5u);

  config = LoadJobConfig(bad);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith(bad + ":2:"));
}

TEST(LoadJobConfigTest, DirectoryIsAnError) {
  absl::StatusOr<v1::JobConfig> config = LoadJobConfig(MakeTempDir());
  EXPECT_FALSE(config.ok());
}

// ---------------------------------------------------------------------------
// ApplyOverride

TEST(ApplyOverrideTest, Float) {
  v1::JobConfig config = ValidConfig();
  ASSERT_TRUE(ApplyOverride(&config, "optimizer.lr=0.05").ok());
  EXPECT_EQ(config.optimizer().lr(), 0.05f);
  ASSERT_TRUE(ApplyOverride(&config, "optimizer.weight_decay=1e-3").ok());
  EXPECT_EQ(config.optimizer().weight_decay(), 1e-3f);
  ASSERT_TRUE(ApplyOverride(&config, "cluster.round_timeout_s=2.5").ok());
  EXPECT_EQ(config.cluster().round_timeout_s(), 2.5);
}

TEST(ApplyOverrideTest, UnsignedIntegers) {
  v1::JobConfig config = ValidConfig();
  ASSERT_TRUE(ApplyOverride(&config, "seed=7").ok());
  EXPECT_EQ(config.seed(), 7u);
  ASSERT_TRUE(ApplyOverride(&config, "seed=18446744073709551615").ok());
  EXPECT_EQ(config.seed(), std::numeric_limits<uint64_t>::max());
  ASSERT_TRUE(ApplyOverride(&config, "cluster.num_workers=12").ok());
  EXPECT_EQ(config.cluster().num_workers(), 12u);
}

TEST(ApplyOverrideTest, EnumByName) {
  v1::JobConfig config = ValidConfig();
  ASSERT_TRUE(ApplyOverride(&config, "optimizer.momentum_kind=HEAVY_BALL").ok());
  EXPECT_EQ(config.optimizer().momentum_kind(),
            v1::OptimizerConfig::HEAVY_BALL);
  ASSERT_TRUE(ApplyOverride(&config, "model.kind=SOFTMAX").ok());
  EXPECT_EQ(config.model().kind(), v1::ModelConfig::SOFTMAX);
  ASSERT_TRUE(ApplyOverride(&config, "optimizer.schedule=step_decay").ok());
  EXPECT_EQ(config.optimizer().schedule(), v1::OptimizerConfig::STEP_DECAY);
}

TEST(ApplyOverrideTest, RepeatedListReplacesField) {
  v1::JobConfig config = ValidConfig();
  ASSERT_THAT(config.model().hidden(), ElementsAre(64u));
  ASSERT_TRUE(ApplyOverride(&config, "model.hidden=256,128").ok());
  EXPECT_THAT(config.model().hidden(), ElementsAre(256u, 128u));
  ASSERT_TRUE(ApplyOverride(&config, "model.hidden= 32 , 16 ,8").ok());
  EXPECT_THAT(config.model().hidden(), ElementsAre(32u, 16u, 8u));

  ASSERT_TRUE(ApplyOverride(
                  &config, "cluster.servers=127.0.0.1:5000,127.0.0.1:5001,h:7")
                  .ok());
  EXPECT_THAT(config.cluster().servers(),
              ElementsAre("127.0.0.1:5000", "127.0.0.1:5001", "h:7"));

  ASSERT_TRUE(ApplyOverride(&config, "model.hidden=").ok());
  EXPECT_TRUE(config.model().hidden().empty());
}

TEST(ApplyOverrideTest, NestedPathAndStrings) {
  v1::JobConfig config;
  ASSERT_TRUE(ApplyOverride(&config, "data.batch_size=128").ok());
  EXPECT_EQ(config.data().batch_size(), 128u);
  ASSERT_TRUE(ApplyOverride(&config, "algorithm.name=ssgd").ok());
  EXPECT_EQ(config.algorithm().name(), "ssgd");
  // A singular string takes the value verbatim, commas included.
  ASSERT_TRUE(ApplyOverride(&config, "name=a,b = c").ok());
  EXPECT_EQ(config.name(), "a,b = c");
  ASSERT_TRUE(ApplyOverride(&config, "data.dir=").ok());
  EXPECT_EQ(config.data().dir(), "");
}

struct OverrideErrorCase {
  std::string assignment;
  std::vector<std::string> message_parts;
};

TEST(ApplyOverrideTest, ErrorsNamePathAndProblemAndLeaveConfigUnchanged) {
  const std::vector<OverrideErrorCase> cases = {
      {"optimizer.lrr=0.1", {"optimizer.lrr", "unknown field"}},
      {"optimiser.lr=0.1", {"optimiser.lr", "unknown field \"optimiser\""}},
      {"optimizer.lr=abc", {"optimizer.lr", "\"abc\"", "float"}},
      {"optimizer.lr=0.1x", {"optimizer.lr", "float"}},
      {"optimizer.lr=1e40", {"optimizer.lr", "range"}},
      {"optimizer.lr=", {"optimizer.lr", "float"}},
      {"cluster.num_workers=-1", {"cluster.num_workers", "uint32"}},
      {"cluster.num_workers=4294967296", {"cluster.num_workers", "uint32"}},
      {"cluster.num_workers=2.5", {"cluster.num_workers", "uint32"}},
      {"seed=-3", {"seed", "uint64"}},
      {"optimizer.momentum_kind=SIDEWAYS",
       {"optimizer.momentum_kind", "SIDEWAYS", "NESTEROV"}},
      {"model.hidden=256,x", {"model.hidden[1]", "uint32"}},
      {"seed.low=1", {"seed.low", "\"seed\" is not a message"}},
      {"optimizer=1", {"optimizer", "is a message"}},
      {"optimizer.lr", {"optimizer.lr", "field.path=value"}},
      {"=3", {"missing field path"}},
      {"optimizer..lr=1", {"optimizer..lr", "unknown field"}},
  };
  for (const OverrideErrorCase& c : cases) {
    SCOPED_TRACE(c.assignment);
    v1::JobConfig config = ValidConfig();
    const v1::JobConfig before = config;
    absl::Status status = ApplyOverride(&config, c.assignment);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(part));
    }
    EXPECT_EQ(config.SerializeAsString(), before.SerializeAsString());
  }
}

TEST(SplitOverridesTest, SplitsAtSemicolonsAndDropsBlankPieces) {
  EXPECT_THAT(SplitOverrides("model.hidden=2,3;seed=7; ;;name=x "),
              ElementsAre("model.hidden=2,3", "seed=7", "name=x "));
  EXPECT_TRUE(SplitOverrides("").empty());
}

// A flag parser keeps the last of several --set; they are all taken, in
// order, whichever spelling each has, and nothing after "--" (a launched
// command's own arguments).
TEST(RepeatedSetFlagsTest, JoinsEverySetBeforeTheCommand) {
  std::vector<std::string> args = {"prog", "--set=optimizer.lr=0.5", "--config=x",
                                   "-set", "epochs=3", "--set", "seed=7;name=y",
                                   "--", "--set=not.ours=1"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  EXPECT_EQ(RepeatedSetFlags(static_cast<int>(argv.size()), argv.data()),
            "optimizer.lr=0.5;epochs=3;seed=7;name=y");
  EXPECT_EQ(RepeatedSetFlags(3, argv.data()), std::nullopt) << "one --set is the flag's own";
}

// ---------------------------------------------------------------------------
// LoadJobWithOverrides

constexpr char kMinimalConfig[] =
    "cluster { servers: \"127.0.0.1:0\" num_workers: 2 }\n"
    "model { kind: SOFTMAX }\n"
    "data { batch_size: 8 }\n"
    "optimizer { lr: 0.1 }\n"
    "epochs: 1\n";

// The minimal config lists a port-0 server, as the launcher's do.
ValidateOptions PortZero() {
  ValidateOptions options;
  options.allow_port_zero = true;
  return options;
}

std::string WriteMinimalConfig() {
  const std::string path = MakeTempDir() + "/job.textproto";
  std::ofstream(path) << kMinimalConfig;
  return path;
}

TEST(LoadJobWithOverridesTest, LoadsOverridesDefaultsAndValidates) {
  const std::string path = WriteMinimalConfig();
  absl::StatusOr<v1::JobConfig> config = LoadJobWithOverrides(
      path, {"optimizer.lr=0.05", "cluster.num_workers=3"}, PortZero());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->optimizer().lr(), 0.05f);
  EXPECT_EQ(config->cluster().num_workers(), 3u);
  EXPECT_EQ(config->algorithm().name(), "ssgd");  // a default
}

TEST(LoadJobWithOverridesTest, ErrorsSayWhereTheyCameFrom) {
  EXPECT_EQ(LoadJobWithOverrides("", {}).status(),
            absl::InvalidArgumentError("--config: a job config file is required"));

  const std::string path = WriteMinimalConfig();
  absl::Status status =
      LoadJobWithOverrides(path, {"optimizer.lr=abc"}, PortZero()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("--set optimizer.lr=abc: optimizer.lr: "));

  // The value may be the override's: the message says both.
  status = LoadJobWithOverrides(path, {"optimizer.lr=-1"}, PortZero()).status();
  EXPECT_EQ(status, absl::InvalidArgumentError(
                        absl::StrCat(path,
                                     " with its overrides (--set, --resume, "
                                     "--restart_on_failure): optimizer.lr: must be > 0 "
                                     "and finite (got -1)")));

  // The options reach validation.
  status = LoadJobWithOverrides(path, {}).status();
  EXPECT_THAT(std::string(status.message()),
              StartsWith(absl::StrCat(path, ": cluster.servers[0]: ")));

  status = LoadJobWithOverrides(path + ".missing", {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// ApplyDefaults

TEST(ApplyDefaultsTest, FillsDocumentedDefaults) {
  v1::JobConfig config;
  ApplyDefaults(&config);
  EXPECT_EQ(config.cluster().max_message_bytes(), 4u * 1024 * 1024);
  EXPECT_EQ(config.cluster().round_timeout_s(), 60.0);
  EXPECT_EQ(config.cluster().max_step_lag(), 8u);
  EXPECT_EQ(config.cluster().retained_rounds(), 4u);
  EXPECT_EQ(config.model().input_dim(), 784u);
  EXPECT_EQ(config.model().num_classes(), 10u);
  EXPECT_EQ(config.data().dir(), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(config.optimizer().momentum_kind(), v1::OptimizerConfig::NONE);
  EXPECT_EQ(config.optimizer().schedule(), v1::OptimizerConfig::CONSTANT);
  EXPECT_EQ(config.algorithm().name(), "ssgd");
  EXPECT_EQ(config.algorithm().block_size(), 1024u);
  EXPECT_EQ(config.log_every_steps(), 50u);
  EXPECT_EQ(config.output_dir(), "out");
  // Fields without a documented default stay unset.
  EXPECT_EQ(config.cluster().num_workers(), 0u);
  EXPECT_EQ(config.data().batch_size(), 0u);
  EXPECT_EQ(config.optimizer().lr(), 0.0f);
  EXPECT_EQ(config.model().kind(), v1::ModelConfig::KIND_UNSPECIFIED);
}

TEST(ApplyDefaultsTest, KeepsSetFieldsAndIsIdempotent) {
  v1::JobConfig config;
  config.mutable_cluster()->set_max_message_bytes(1 << 20);
  config.mutable_cluster()->set_round_timeout_s(5);
  config.mutable_model()->set_num_classes(3);
  config.mutable_data()->set_dir("/data");
  config.mutable_optimizer()->set_momentum_kind(
      v1::OptimizerConfig::HEAVY_BALL);
  config.mutable_optimizer()->set_schedule(v1::OptimizerConfig::STEP_DECAY);
  config.mutable_algorithm()->set_block_size(7);
  config.set_output_dir("elsewhere");
  ApplyDefaults(&config);
  EXPECT_EQ(config.cluster().max_message_bytes(), 1u << 20);
  EXPECT_EQ(config.cluster().round_timeout_s(), 5.0);
  EXPECT_EQ(config.model().num_classes(), 3u);
  EXPECT_EQ(config.data().dir(), "/data");
  EXPECT_EQ(config.optimizer().momentum_kind(),
            v1::OptimizerConfig::HEAVY_BALL);
  EXPECT_EQ(config.optimizer().schedule(), v1::OptimizerConfig::STEP_DECAY);
  EXPECT_EQ(config.algorithm().block_size(), 7u);
  EXPECT_EQ(config.output_dir(), "elsewhere");

  const std::string once = config.SerializeAsString();
  ApplyDefaults(&config);
  EXPECT_EQ(config.SerializeAsString(), once);
}

// ---------------------------------------------------------------------------
// ValidateJobConfig

TEST(ValidateJobConfigTest, ValidConfigPasses) {
  absl::Status status = ValidateJobConfig(ValidConfig());
  EXPECT_TRUE(status.ok()) << status;
}

struct ValidationCase {
  std::string name;
  std::function<void(v1::JobConfig*)> mutate;
  std::string field;  // the message must start with "<field>: "
};

TEST(ValidateJobConfigTest, EachRuleNamesItsField) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const std::vector<ValidationCase> cases = {
      {"no servers", [](v1::JobConfig* c) { c->mutable_cluster()->clear_servers(); },
       "cluster.servers"},
      {"server without port",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, "localhost"); },
       "cluster.servers[0]"},
      {"server port too large",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(1, "h:65536"); },
       "cluster.servers[1]"},
      {"server port not a number",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(1, "h:http"); },
       "cluster.servers[1]"},
      {"server port negative",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, "h:-1"); },
       "cluster.servers[0]"},
      {"server port empty",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, "h:"); },
       "cluster.servers[0]"},
      {"server without host",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, ":5000"); },
       "cluster.servers[0]"},
      {"server port zero not allowed",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, "h:0"); },
       "cluster.servers[0]"},
      {"unbracketed ipv6",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_servers(0, "::1:5000"); },
       "cluster.servers[0]"},
      {"duplicate server",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_servers(1, c->cluster().servers(0));
       },
       "cluster.servers[1]"},
      {"no workers",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_num_workers(0); },
       "cluster.num_workers"},
      {"message bytes below 64 KiB",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_max_message_bytes(64 * 1024 - 1);
       },
       "cluster.max_message_bytes"},
      {"message bytes above 1 GiB",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_max_message_bytes((1u << 30) + 1);
       },
       "cluster.max_message_bytes"},
      {"chunk not a multiple of 4",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_chunk_bytes(65538); },
       "cluster.chunk_bytes"},
      {"chunk below 4 KiB",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_chunk_bytes(4092); },
       "cluster.chunk_bytes"},
      {"chunk beyond the message limit",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_max_message_bytes(64 * 1024);
         c->mutable_cluster()->set_chunk_bytes(64 * 1024 - 1020);
       },
       "cluster.chunk_bytes"},
      {"negative round timeout",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_round_timeout_s(-1); },
       "cluster.round_timeout_s"},
      {"NaN round timeout",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_round_timeout_s(std::nan(""));
       },
       "cluster.round_timeout_s"},
      {"no retained rounds",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_retained_rounds(0); },
       "cluster.retained_rounds"},
      {"model kind unset",
       [](v1::JobConfig* c) {
         c->mutable_model()->set_kind(v1::ModelConfig::KIND_UNSPECIFIED);
       },
       "model.kind"},
      {"MLP without hidden layers",
       [](v1::JobConfig* c) { c->mutable_model()->clear_hidden(); },
       "model.hidden"},
      {"MLP hidden width zero",
       [](v1::JobConfig* c) { c->mutable_model()->add_hidden(0); },
       "model.hidden[1]"},
      {"SOFTMAX with hidden layers",
       [](v1::JobConfig* c) { c->mutable_model()->set_kind(v1::ModelConfig::SOFTMAX); },
       "model.hidden"},
      {"input_dim zero",
       [](v1::JobConfig* c) { c->mutable_model()->set_input_dim(0); },
       "model.input_dim"},
      {"one class",
       [](v1::JobConfig* c) { c->mutable_model()->set_num_classes(1); },
       "model.num_classes"},
      {"batch size zero",
       [](v1::JobConfig* c) { c->mutable_data()->set_batch_size(0); },
       "data.batch_size"},
      {"rank batch sizes count differs from workers",
       [](v1::JobConfig* c) {
         for (int i = 0; i < 3; ++i) c->mutable_data()->add_rank_batch_sizes(8);
       },
       "data.rank_batch_sizes"},
      {"rank batch size zero",
       [](v1::JobConfig* c) {
         for (uint32_t b : {8u, 8u, 0u, 8u}) {
           c->mutable_data()->add_rank_batch_sizes(b);
         }
       },
       "data.rank_batch_sizes[2]"},
      {"lr zero", [](v1::JobConfig* c) { c->mutable_optimizer()->set_lr(0); },
       "optimizer.lr"},
      {"lr NaN", [kNan](v1::JobConfig* c) { c->mutable_optimizer()->set_lr(kNan); },
       "optimizer.lr"},
      {"lr infinite",
       [kInf](v1::JobConfig* c) { c->mutable_optimizer()->set_lr(kInf); },
       "optimizer.lr"},
      {"momentum one",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_momentum(1.0f); },
       "optimizer.momentum"},
      {"momentum negative",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::NONE);
         c->mutable_optimizer()->set_momentum(-0.1f);
       },
       "optimizer.momentum"},
      {"heavy ball without momentum",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_momentum_kind(
             v1::OptimizerConfig::HEAVY_BALL);
         c->mutable_optimizer()->set_momentum(0);
       },
       "optimizer.momentum"},
      {"nesterov without momentum",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_momentum(0); },
       "optimizer.momentum"},
      {"negative weight decay",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_weight_decay(-1e-4f); },
       "optimizer.weight_decay"},
      {"step decay without step_epochs",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::STEP_DECAY);
         c->mutable_optimizer()->set_gamma(0.5f);
       },
       "optimizer.step_epochs"},
      {"step decay gamma zero",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::STEP_DECAY);
         c->mutable_optimizer()->set_step_epochs(1);
       },
       "optimizer.gamma"},
      {"step decay gamma above one",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::STEP_DECAY);
         c->mutable_optimizer()->set_step_epochs(1);
         c->mutable_optimizer()->set_gamma(1.5f);
       },
       "optimizer.gamma"},
      {"warm-up as long as training",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_warmup_epochs(3.0f); },
       "optimizer.warmup_epochs"},
      {"negative warm-up",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_warmup_epochs(-0.5f); },
       "optimizer.warmup_epochs"},
      {"no epochs", [](v1::JobConfig* c) { c->set_epochs(0); }, "epochs"},
      {"unknown algorithm",
       [](v1::JobConfig* c) { c->mutable_algorithm()->set_name("bogus"); },
       "algorithm.name"},
      {"block size zero",
       [](v1::JobConfig* c) { c->mutable_algorithm()->set_block_size(0); },
       "algorithm.block_size"},
      {"checkpoints without a folder",
       [](v1::JobConfig* c) { c->mutable_checkpoint()->set_every_steps(100); },
       "checkpoint.every_steps"},
      {"checkpoints of async-sgd",
       [](v1::JobConfig* c) {
         c->mutable_algorithm()->set_name("async-sgd");
         c->mutable_checkpoint()->set_dir("/tmp/ckpt");
         c->mutable_checkpoint()->set_every_steps(100);
       },
       "checkpoint.every_steps"},
      {"resume without checkpoints",
       [](v1::JobConfig* c) { c->mutable_checkpoint()->set_resume(true); },
       "checkpoint.resume"},
      {"admissions without elastic",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_admit_every_steps(10); },
       "cluster.admit_every_steps"},
      {"admissions of nodes",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_elastic(true);
         c->mutable_cluster()->set_local_size(2);
         c->mutable_cluster()->set_admit_every_steps(10);
       },
       "cluster.admit_every_steps"},
      {"pipe-sgd's next push beyond the step window",
       [](v1::JobConfig* c) {
         c->mutable_algorithm()->set_name("pipe-sgd");
         c->mutable_cluster()->set_max_step_lag(1);
       },
       "cluster.max_step_lag"},
      {"pipe-sgd's retry after the next step's round",
       [](v1::JobConfig* c) {
         c->mutable_algorithm()->set_name("pipe-sgd");
         c->mutable_cluster()->set_retained_rounds(1);
       },
       "cluster.retained_rounds"},
      {"more worker processes than a float counts",
       [](v1::JobConfig* c) {
         c->mutable_cluster()->set_num_workers(65536);
         c->mutable_cluster()->set_local_size(65536);
       },
       "cluster.num_workers"},
      {"a model beyond any memory",
       [](v1::JobConfig* c) {
         c->mutable_model()->clear_hidden();
         c->mutable_model()->set_kind(v1::ModelConfig::FLAT);
         c->mutable_model()->set_num_params(std::numeric_limits<uint64_t>::max());
       },
       "model.num_params"},
      {"momentum without its kind",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::NONE);
       },
       "optimizer.momentum"},
      {"gamma without step decay",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_gamma(0.5f); },
       "optimizer.gamma"},
      {"step_epochs without step decay",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_step_epochs(2); },
       "optimizer.step_epochs"},
      {"warm-up without its schedule",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::CONSTANT);
       },
       "optimizer.warmup_epochs"},
  };
  for (const ValidationCase& c : cases) {
    SCOPED_TRACE(c.name);
    v1::JobConfig config = ValidConfig();
    c.mutate(&config);
    absl::Status status = ValidateJobConfig(config);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), StartsWith(c.field + ": "));
  }
}

// 9 blocks over 4 shards leave shard 3 none (docs/protocol.md, "Block
// layout"): a job may run so, but not with what needs every shard's rounds.
v1::JobConfig FourShardsOfNineBlocks() {
  v1::JobConfig config = ValidConfig();
  v1::ModelConfig* model = config.mutable_model();
  model->clear_hidden();
  model->set_kind(v1::ModelConfig::FLAT);
  model->set_num_params(72);
  config.mutable_algorithm()->set_block_size(8);
  config.mutable_cluster()->clear_servers();
  for (int s = 0; s < 4; ++s) {
    config.mutable_cluster()->add_servers(absl::StrCat("127.0.0.1:", 7000 + s));
  }
  return config;
}

// Its checkpoints could never complete.
TEST(ValidateJobConfigTest, CheckpointsNeedEveryShardToOwnABlock) {
  v1::JobConfig config = FourShardsOfNineBlocks();
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  config.mutable_checkpoint()->set_dir("/tmp/ckpt");
  config.mutable_checkpoint()->set_every_steps(10);
  const absl::Status status = ValidateJobConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(status.message(),
            "checkpoint.every_steps: shard 3 of 4 owns no block of the model (9 blocks of "
            "algorithm.block_size 8), so it writes no checkpoint file and no checkpoint would "
            "complete: use at most 3 servers");
  config.mutable_cluster()->mutable_servers()->RemoveLast();
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
}

// Nor could a rank dropped from an elastic job rejoin: the shard without a
// block has no rounds, so it never drops the rank and never takes it back.
TEST(ValidateJobConfigTest, AdmissionsNeedEveryShardToOwnABlock) {
  v1::JobConfig config = FourShardsOfNineBlocks();
  config.mutable_cluster()->set_elastic(true);
  config.mutable_cluster()->set_admit_every_steps(10);
  const absl::Status status = ValidateJobConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              StartsWith("cluster.admit_every_steps: shard 3 of 4 owns no block of the model"));
  config.mutable_cluster()->mutable_servers()->RemoveLast();
  EXPECT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
}

TEST(ValidateJobConfigTest, FlatModelHasOnlyItsSize) {
  v1::JobConfig config = ValidConfig();
  v1::ModelConfig* model = config.mutable_model();
  model->clear_hidden();
  model->set_kind(v1::ModelConfig::FLAT);
  model->set_num_params(12345);
  ASSERT_TRUE(ValidateJobConfig(config).ok()) << ValidateJobConfig(config);
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(*model);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_params, 12345u);
  EXPECT_TRUE(spec->layers.empty());

  const std::vector<std::pair<std::function<void(v1::ModelConfig*)>, std::string>> cases = {
      {[](v1::ModelConfig* m) { m->set_num_params(0); }, "model.num_params: must be >= 1"},
      {[](v1::ModelConfig* m) { m->add_hidden(8); }, "model.hidden: a FLAT model"},
      {[](v1::ModelConfig* m) { m->set_kernel_size(3); }, "model.kernel_size"},
      {[](v1::ModelConfig* m) {
         m->set_kind(v1::ModelConfig::SOFTMAX);
       },
       "model.num_params: only a FLAT model has it (kind is SOFTMAX)"},
  };
  for (const auto& [mutate, message] : cases) {
    v1::JobConfig bad = config;
    mutate(bad.mutable_model());
    const absl::Status status = ValidateJobConfig(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(status.message()), StartsWith(message));
  }
}

TEST(ValidateJobConfigTest, MessageShowsTheBadValue) {
  v1::JobConfig config = ValidConfig();
  config.mutable_optimizer()->set_lr(-1);
  absl::Status status = ValidateJobConfig(config);
  EXPECT_THAT(std::string(status.message()), StartsWith("optimizer.lr: must be > 0"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("(got -1)"));
}

TEST(ValidateJobConfigTest, BoundaryValuesAndAlternativesPass) {
  const std::vector<std::pair<std::string, std::function<void(v1::JobConfig*)>>>
      cases = {
          {"64 KiB messages",
           [](v1::JobConfig* c) {
             c->mutable_cluster()->set_max_message_bytes(64 * 1024);
           }},
          {"1 GiB messages",
           [](v1::JobConfig* c) {
             c->mutable_cluster()->set_max_message_bytes(1u << 30);
           }},
          {"4 KiB chunks",
           [](v1::JobConfig* c) { c->mutable_cluster()->set_chunk_bytes(4096); }},
          {"chunks of the whole message limit",
           [](v1::JobConfig* c) {
             c->mutable_cluster()->set_max_message_bytes(64 * 1024);
             c->mutable_cluster()->set_chunk_bytes(64 * 1024 - 1024);
           }},
          {"ports 1 and 65535",
           [](v1::JobConfig* c) {
             c->mutable_cluster()->set_servers(0, "a:1");
             c->mutable_cluster()->set_servers(1, "b:65535");
           }},
          {"bracketed ipv6",
           [](v1::JobConfig* c) {
             c->mutable_cluster()->set_servers(0, "[::1]:5000");
           }},
          {"rank batch sizes replace batch size",
           [](v1::JobConfig* c) {
             c->mutable_data()->set_batch_size(0);
             for (uint32_t b : {8u, 16u, 8u, 32u}) {
               c->mutable_data()->add_rank_batch_sizes(b);
             }
           }},
          {"softmax",
           [](v1::JobConfig* c) {
             c->mutable_model()->set_kind(v1::ModelConfig::SOFTMAX);
             c->mutable_model()->clear_hidden();
           }},
          {"plain SGD, constant lr",
           [](v1::JobConfig* c) {
             c->mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::NONE);
             c->mutable_optimizer()->set_momentum(0);
             c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::CONSTANT);
             c->mutable_optimizer()->set_warmup_epochs(0);
           }},
          {"step decay gamma one",
           [](v1::JobConfig* c) {
             c->mutable_optimizer()->set_schedule(v1::OptimizerConfig::STEP_DECAY);
             c->mutable_optimizer()->set_step_epochs(1);
             c->mutable_optimizer()->set_gamma(1.0f);
             c->mutable_optimizer()->set_warmup_epochs(0);
           }},
          {"no warm-up",
           [](v1::JobConfig* c) { c->mutable_optimizer()->set_warmup_epochs(0); }},
      };
  for (const auto& [name, mutate] : cases) {
    SCOPED_TRACE(name);
    v1::JobConfig config = ValidConfig();
    mutate(&config);
    absl::Status status = ValidateJobConfig(config);
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(ValidateJobConfigTest, PortZeroOnlyWhenAllowed) {
  v1::JobConfig config = ValidConfig();
  config.mutable_cluster()->set_servers(0, "127.0.0.1:0");
  config.mutable_cluster()->set_servers(1, "127.0.0.1:0");
  EXPECT_FALSE(ValidateJobConfig(config).ok());
  ValidateOptions options;
  options.allow_port_zero = true;
  absl::Status status = ValidateJobConfig(config, options);
  EXPECT_TRUE(status.ok()) << status;
}

// ---------------------------------------------------------------------------
// RankBatchSizes

TEST(RankBatchSizesTest, CopiesBatchSizePerWorkerOrUsesRankSizes) {
  v1::JobConfig config = ValidConfig();
  EXPECT_THAT(RankBatchSizes(config), ElementsAre(32u, 32u, 32u, 32u));
  for (uint32_t b : {8u, 16u, 24u, 32u}) {
    config.mutable_data()->add_rank_batch_sizes(b);
  }
  EXPECT_THAT(RankBatchSizes(config), ElementsAre(8u, 16u, 24u, 32u));
}

TEST(RankBatchSizesTest, SpeedsSplitTheTotalInProportion) {
  v1::JobConfig config = ValidConfig();  // 4 workers x 32 = 128 in all
  for (float s : {0.5f, 0.5f, 1.0f, 1.0f}) config.mutable_data()->add_rank_speeds(s);
  ASSERT_TRUE(ValidateJobConfig(config).ok());
  // 128 * 0.5/3 = 21.33 and 128 * 1/3 = 42.67: floors 21, 21, 42, 42 leave 2,
  // which go to the largest remainders (ranks 2 and 3).
  EXPECT_THAT(RankBatchSizes(config), ElementsAre(21u, 21u, 43u, 43u));
  config.mutable_data()->clear_rank_speeds();
  for (float s : {1.0f, 3.0f, 0.0001f, 1.0f}) config.mutable_data()->add_rank_speeds(s);
  const std::vector<uint32_t> sizes = RankBatchSizes(config);
  EXPECT_EQ(sizes[2], 1u);  // never 0, however slow
  EXPECT_NEAR(sizes[1], 3.0 * sizes[0], 3.0);  // 77 and 26: rounding moves 1 each
  // That example comes from the largest share: the total stays 128.
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), 0u), 128u);
  // A total of 4, of which the fastest rank's share rounds to 3: each of
  // the others gets its one example from it.
  config.mutable_data()->set_batch_size(1);
  config.mutable_data()->clear_rank_speeds();
  for (float s : {10.0f, 1.0f, 1.0f, 1.0f}) config.mutable_data()->add_rank_speeds(s);
  ASSERT_TRUE(ValidateJobConfig(config).ok());
  EXPECT_THAT(RankBatchSizes(config), ElementsAre(1u, 1u, 1u, 1u));
}

TEST(ValidateJobConfigTest, NameIsASafeIdentifier) {
  v1::JobConfig config = ValidConfig();
  config.set_name("my-job_2.1");
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.set_name("a \"quoted\" name");
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("name: may hold only letters"));
}

TEST(RankBatchSizesTest, PerRankListsAreValidated) {
  v1::JobConfig config = ValidConfig();
  config.mutable_data()->add_rank_speeds(1.0f);
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("data.rank_speeds: must have one entry per worker: has 1"));
  for (float s : {1.0f, 0.0f, 1.0f}) config.mutable_data()->add_rank_speeds(s);
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("data.rank_speeds[2]: must be finite and > 0 (got 0)"));
  config.mutable_data()->set_rank_speeds(2, 2.0f);
  config.mutable_data()->add_rank_batch_sizes(1);
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("set either rank_speeds or rank_batch_sizes"));
  config = ValidConfig();
  for (float s : {1.0f, 2.0f, 0.5f, 1.0f}) config.mutable_data()->add_rank_slowdown(s);
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("data.rank_slowdown[2]: must be finite and >= 1 and <= 1000 (got 0.5)"));
  // A slowdown whose sleep would not end.
  config.mutable_data()->set_rank_slowdown(2, 1e30f);
  EXPECT_THAT(std::string(ValidateJobConfig(config).message()),
              HasSubstr("data.rank_slowdown[2]: must be finite and >= 1 and <= 1000 (got 1e+30)"));
  config.mutable_data()->set_rank_slowdown(2, 1000.0f);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

// ---------------------------------------------------------------------------
// JobFingerprint and CompareJobConfigs

// FNV-1a 64 written out here from its definition, to check JobFingerprint
// against the documented algorithm rather than against itself.
uint64_t ReferenceFnv1a64(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char b : bytes) {
    hash = (hash ^ b) * 0x100000001b3ull;
  }
  return hash;
}

TEST(JobFingerprintTest, ReferenceHashMatchesPublishedVectors) {
  EXPECT_EQ(ReferenceFnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(ReferenceFnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(ReferenceFnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(JobFingerprintTest, IsFnv1aOfNormalisedSerialization) {
  const v1::JobConfig config = ValidConfig();
  // Normalised by hand: local fields cleared, the two server entries kept.
  v1::JobConfig normalised = config;
  normalised.mutable_cluster()->set_servers(0, "");
  normalised.mutable_cluster()->set_servers(1, "");
  normalised.mutable_data()->clear_dir();
  normalised.clear_log_every_steps();
  normalised.clear_evals_per_epoch();
  normalised.clear_output_dir();
  // A proto3 message without maps serializes in field-number order, so the
  // plain serialization is the deterministic one.
  EXPECT_EQ(JobFingerprint(config),
            ReferenceFnv1a64(normalised.SerializeAsString()));
}

TEST(JobFingerprintTest, StableForSeparatelyBuiltEqualConfigs) {
  absl::StatusOr<v1::JobConfig> parsed = ParseJobConfig(
      "name: \"test\" seed: 42 epochs: 3\n"
      "cluster { servers: \"127.0.0.1:5000\" servers: \"127.0.0.1:5001\"\n"
      "          num_workers: 4 }\n"
      "model { kind: MLP hidden: 64 }\n"
      "data { batch_size: 32 }\n"
      "optimizer { lr: 0.1 momentum_kind: NESTEROV momentum: 0.9\n"
      "            weight_decay: 1e-4 schedule: WARMUP_COSINE\n"
      "            warmup_epochs: 0.5 }\n",
      "inline");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(JobFingerprint(*parsed), JobFingerprint(ValidConfig()));
  EXPECT_EQ(JobFingerprint(ValidConfig()), JobFingerprint(ValidConfig()));
  // Defaults are part of the normalisation: unset equals explicit default.
  ApplyDefaults(&*parsed);
  EXPECT_EQ(JobFingerprint(*parsed), JobFingerprint(ValidConfig()));
}

TEST(JobFingerprintTest, IgnoresLocalFields) {
  const v1::JobConfig base = ValidConfig();
  v1::JobConfig local = base;
  local.mutable_cluster()->set_servers(0, "10.1.2.3:7000");
  local.mutable_cluster()->set_servers(1, "server-b.internal:7001");
  local.mutable_data()->set_dir("/mnt/elsewhere");
  local.set_log_every_steps(1);
  local.set_evals_per_epoch(10);
  local.set_output_dir("/tmp/other-out");
  local.mutable_cluster()->set_transport(v1::ClusterConfig::GRPC);
  // A checkpoint section without every_steps is as none at all.
  local.mutable_checkpoint()->set_dir("/mnt/ckpt");
  local.mutable_checkpoint()->set_keep(5);
  EXPECT_EQ(JobFingerprint(base), JobFingerprint(local));
  absl::Status status = CompareJobConfigs(base, local, "server", "worker");
  EXPECT_TRUE(status.ok()) << status;
}

struct NonLocalCase {
  std::string field;
  std::function<void(v1::JobConfig*)> mutate;
};

TEST(JobFingerprintTest, NonLocalDifferencesChangeItAndAreNamed) {
  const std::vector<NonLocalCase> cases = {
      {"name", [](v1::JobConfig* c) { c->set_name("other"); }},
      {"seed", [](v1::JobConfig* c) { c->set_seed(43); }},
      {"cluster.servers",
       [](v1::JobConfig* c) { c->mutable_cluster()->add_servers("h:9"); }},
      {"cluster.num_workers",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_num_workers(5); }},
      {"cluster.max_step_lag",
       [](v1::JobConfig* c) { c->mutable_cluster()->set_max_step_lag(2); }},
      {"model.hidden",
       [](v1::JobConfig* c) { c->mutable_model()->add_hidden(32); }},
      {"data.batch_size",
       [](v1::JobConfig* c) { c->mutable_data()->set_batch_size(33); }},
      {"data.rank_batch_sizes",
       [](v1::JobConfig* c) { c->mutable_data()->add_rank_batch_sizes(1); }},
      {"data.train_limit",
       [](v1::JobConfig* c) { c->mutable_data()->set_train_limit(100); }},
      {"optimizer.lr",
       [](v1::JobConfig* c) { c->mutable_optimizer()->set_lr(0.05f); }},
      {"optimizer.momentum_kind",
       [](v1::JobConfig* c) {
         c->mutable_optimizer()->set_momentum_kind(
             v1::OptimizerConfig::HEAVY_BALL);
       }},
      {"algorithm.block_size",
       [](v1::JobConfig* c) { c->mutable_algorithm()->set_block_size(512); }},
      {"epochs", [](v1::JobConfig* c) { c->set_epochs(4); }},
      {"checkpoint.every_steps",
       [](v1::JobConfig* c) {
         c->mutable_checkpoint()->set_dir("/tmp/ckpt");
         c->mutable_checkpoint()->set_every_steps(50);
       }},
  };
  const v1::JobConfig base = ValidConfig();
  for (const NonLocalCase& c : cases) {
    SCOPED_TRACE(c.field);
    v1::JobConfig changed = base;
    c.mutate(&changed);
    EXPECT_NE(JobFingerprint(base), JobFingerprint(changed));
    absl::Status status = CompareJobConfigs(base, changed, "server", "worker");
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(status.message()),
                StartsWith("config mismatch at " + c.field + ": "));
  }
}

TEST(JobFingerprintTest, AdmissionStepsArePartOfAnElasticJob) {
  v1::JobConfig elastic = ValidConfig();
  elastic.mutable_cluster()->set_elastic(true);
  v1::JobConfig admitting = elastic;
  admitting.mutable_cluster()->set_admit_every_steps(20);
  EXPECT_NE(JobFingerprint(elastic), JobFingerprint(admitting));
  const absl::Status differs = CompareJobConfigs(elastic, admitting, "server", "worker");
  EXPECT_THAT(std::string(differs.message()), HasSubstr("cluster.admit_every_steps"));
}

TEST(CompareJobConfigsTest, NamesFieldAndBothValues) {
  v1::JobConfig server = ValidConfig();
  v1::JobConfig worker = ValidConfig();
  worker.mutable_optimizer()->set_lr(0.05f);
  absl::Status status = CompareJobConfigs(server, worker, "server", "worker");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "config mismatch at optimizer.lr: server has 0.1, worker has 0.05");
}

TEST(CompareJobConfigsTest, ShowsListsEnumsStringsAndServerCounts) {
  v1::JobConfig a = ValidConfig();
  v1::JobConfig b = ValidConfig();
  b.mutable_model()->add_hidden(128);
  EXPECT_EQ(CompareJobConfigs(a, b, "me", "you").message(),
            "config mismatch at model.hidden: me has [64], you has [64, 128]");

  b = ValidConfig();
  b.mutable_optimizer()->set_momentum_kind(v1::OptimizerConfig::HEAVY_BALL);
  EXPECT_EQ(CompareJobConfigs(a, b, "me", "you").message(),
            "config mismatch at optimizer.momentum_kind: me has NESTEROV, "
            "you has HEAVY_BALL");

  b = ValidConfig();
  b.mutable_algorithm()->set_name("other");
  EXPECT_EQ(CompareJobConfigs(a, b, "me", "you").message(),
            "config mismatch at algorithm.name: me has \"ssgd\", "
            "you has \"other\"");

  b = ValidConfig();
  b.mutable_cluster()->clear_servers();
  b.mutable_cluster()->add_servers("127.0.0.1:5000");
  EXPECT_EQ(CompareJobConfigs(a, b, "me", "you").message(),
            "config mismatch at cluster.servers: me has 2 entries, "
            "you has 1 entry");
}

TEST(CompareJobConfigsTest, CloseFloatsPrintDifferently) {
  v1::JobConfig a = ValidConfig();
  v1::JobConfig b = ValidConfig();
  b.mutable_optimizer()->set_lr(std::nextafter(0.1f, 1.0f));
  absl::Status status = CompareJobConfigs(a, b, "a", "b");
  ASSERT_FALSE(status.ok());
  const std::string message(status.message());
  const std::string a_value =
      message.substr(message.find("a has ") + 6,
                     message.find(", b has") - (message.find("a has ") + 6));
  const std::string b_value = message.substr(message.find("b has ") + 6);
  EXPECT_NE(a_value, b_value);
  EXPECT_EQ(std::stof(a_value), 0.1f);
  EXPECT_EQ(std::stof(b_value), std::nextafter(0.1f, 1.0f));
}

TEST(CompareJobConfigsTest, FirstDifferenceInFieldOrderIsReported) {
  v1::JobConfig a = ValidConfig();
  v1::JobConfig b = ValidConfig();
  b.set_epochs(9);
  b.mutable_optimizer()->set_lr(0.2f);
  b.mutable_cluster()->set_num_workers(7);
  EXPECT_THAT(std::string(CompareJobConfigs(a, b, "a", "b").message()),
              StartsWith("config mismatch at cluster.num_workers: "));
}

TEST(CompareJobConfigsTest, UnknownFieldsAreADifference) {
  v1::JobConfig a = ValidConfig();
  v1::JobConfig b = ValidConfig();
  b.GetReflection()->MutableUnknownFields(&b)->AddVarint(1000, 1);
  EXPECT_NE(JobFingerprint(a), JobFingerprint(b));
  absl::Status status = CompareJobConfigs(a, b, "a", "b");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("unknown"));
}

// ---------------------------------------------------------------------------
// The shipped configs

v1::JobConfig LoadShipped(const std::string& name) {
  absl::StatusOr<v1::JobConfig> config =
      LoadJobConfig(std::string(CSERPS_SOURCE_DIR) + "/configs/" + name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : v1::JobConfig();
}

// The fingerprints docs/protocol.md 4.2 lists, by the config file they name
// ("`configs/tiny.textproto` ... `0x9a98a65a87cb504b`").
std::map<std::string, uint64_t> DocumentedFingerprints() {
  std::ifstream in(std::string(CSERPS_SOURCE_DIR) + "/docs/protocol.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(doc.empty());
  std::map<std::string, uint64_t> out;
  const std::regex entry("`configs/([a-z_]+\\.textproto)`[^`]*`0x([0-9a-f]{16})`");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), entry);
       it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(out.emplace((*it)[1], std::stoull((*it)[2], nullptr, 16)).second)
        << (*it)[1] << " is listed twice";
  }
  return out;
}

// The test vectors of docs/protocol.md 4.2, which an independent client
// checks its fingerprint against: every committed config is listed with the
// fingerprint the C++ computes.
TEST(ShippedConfigsTest, FingerprintsAreTheDocumentedVectors) {
  v1::JobConfig seed_only;
  seed_only.set_seed(7);
  EXPECT_EQ(JobFingerprint(seed_only), 0x87f0b124b6d7c9c1ull);
  const std::map<std::string, uint64_t> documented = DocumentedFingerprints();
  std::set<std::string> committed;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::string(CSERPS_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    const std::string name = entry.path().filename().string();
    committed.insert(name);
    const auto doc = documented.find(name);
    if (doc == documented.end()) {
      ADD_FAILURE() << "docs/protocol.md 4.2 does not list configs/" << name << ": "
                    << absl::StrCat("0x", absl::Hex(JobFingerprint(LoadShipped(name)),
                                                    absl::kZeroPad16));
      continue;
    }
    EXPECT_EQ(absl::StrCat("0x", absl::Hex(JobFingerprint(LoadShipped(name)), absl::kZeroPad16)),
              absl::StrCat("0x", absl::Hex(doc->second, absl::kZeroPad16)))
        << "configs/" << name;
  }
  for (const auto& [name, unused] : documented) {
    EXPECT_TRUE(committed.count(name)) << "docs/protocol.md lists configs/" << name
                                       << ", which is not committed";
  }
  EXPECT_GE(committed.size(), 2u);
}

TEST(ShippedConfigsTest, EveryConfigParsesAndValidates) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::string(CSERPS_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    absl::StatusOr<v1::JobConfig> config = LoadJobConfig(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    ApplyDefaults(&*config);
    ValidateOptions options;
    options.allow_port_zero = true;  // the launcher assigns ports
    absl::Status status = ValidateJobConfig(*config, options);
    EXPECT_TRUE(status.ok()) << status;
  }
  EXPECT_GE(count, 2);
}

TEST(ShippedConfigsTest, QuickstartHasTheDocumentedShape) {
  const v1::JobConfig config = LoadShipped("quickstart.textproto");
  EXPECT_EQ(config.name(), "quickstart");
  EXPECT_THAT(config.cluster().servers(),
              ElementsAre("127.0.0.1:0", "127.0.0.1:0"));
  EXPECT_EQ(config.cluster().num_workers(), 4u);
  EXPECT_EQ(config.model().kind(), v1::ModelConfig::MLP);
  EXPECT_THAT(config.model().hidden(), ElementsAre(256u));
  EXPECT_EQ(config.data().batch_size(), 64u);
  EXPECT_EQ(config.optimizer().lr(), 0.1f);
  EXPECT_EQ(config.optimizer().momentum_kind(), v1::OptimizerConfig::NESTEROV);
  EXPECT_EQ(config.optimizer().momentum(), 0.9f);
  EXPECT_EQ(config.optimizer().weight_decay(), 1e-4f);
  EXPECT_EQ(config.optimizer().schedule(), v1::OptimizerConfig::WARMUP_COSINE);
  EXPECT_EQ(config.optimizer().warmup_epochs(), 0.2f);
  EXPECT_EQ(config.algorithm().name(), "ssgd");
  EXPECT_EQ(config.algorithm().block_size(), 1024u);
  EXPECT_EQ(config.epochs(), 3u);
  EXPECT_EQ(config.seed(), 42u);
  EXPECT_EQ(config.log_every_steps(), 50u);
  EXPECT_EQ(config.output_dir(), "out/quickstart");
  // Port 0 is only for the local launcher.
  v1::JobConfig defaulted = config;
  ApplyDefaults(&defaulted);
  EXPECT_THAT(std::string(ValidateJobConfig(defaulted).message()),
              StartsWith("cluster.servers[0]: "));
}

TEST(ShippedConfigsTest, TinyIsASmallSoftmaxJob) {
  const v1::JobConfig config = LoadShipped("tiny.textproto");
  EXPECT_EQ(config.cluster().servers_size(), 1);
  EXPECT_EQ(config.cluster().num_workers(), 2u);
  EXPECT_EQ(config.model().kind(), v1::ModelConfig::SOFTMAX);
  EXPECT_TRUE(config.model().hidden().empty());
  EXPECT_EQ(config.data().train_limit(), 2000u);
  EXPECT_EQ(config.data().test_limit(), 1000u);
  EXPECT_EQ(config.epochs(), 1u);
}

}  // namespace
}  // namespace cserps
