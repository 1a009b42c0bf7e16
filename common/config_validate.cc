#include "common/config_validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/algorithm_catalog.h"
#include "common/block_layout.h"
#include "common/direction.h"
#include "common/format_real.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "google/protobuf/repeated_field.h"

namespace cserps {
namespace {

constexpr uint32_t kMinMaxMessageBytes = 64u << 10;
constexpr uint32_t kMaxMaxMessageBytes = 1u << 30;

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckServerAddress(absl::string_view address, int index,
                                bool allow_port_zero) {
  const std::string where = absl::StrCat("cluster.servers[", index, "]");
  const std::string quoted = absl::StrCat("\"", absl::CHexEscape(address), "\"");
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return Invalid(where, absl::StrCat(quoted, " is not host:port"));
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port_text = address.substr(colon + 1);
  for (char c : address) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return Invalid(where, absl::StrCat(quoted, " contains whitespace"));
    }
  }
  if (host.empty() || host == "[]") {
    return Invalid(where, absl::StrCat(quoted, " has no host"));
  }
  const bool bracketed = absl::StartsWith(host, "[");
  if (bracketed != absl::EndsWith(host, "]")) {
    return Invalid(where, absl::StrCat(quoted, " has an unbalanced '[' ']'"));
  }
  if (!bracketed && absl::StrContains(host, ':')) {
    return Invalid(where, absl::StrCat(quoted,
                                       ": an IPv6 host must be in brackets, "
                                       "e.g. [::1]:5000"));
  }
  bool digits_only = !port_text.empty() && port_text.size() <= 5;
  for (char c : port_text) digits_only = digits_only && absl::ascii_isdigit(c);
  uint32_t port = 0;
  if (!digits_only || !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return Invalid(where, absl::StrCat(quoted, " has a port outside 0..65535"));
  }
  if (port == 0 && !allow_port_zero) {
    return Invalid(where, absl::StrCat(quoted,
                                       " has port 0; a server address needs "
                                       "a port in 1..65535"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCluster(const v1::ClusterConfig& cluster,
                             const ValidateOptions& options) {
  if (cluster.servers_size() == 0) {
    return Invalid("cluster.servers", "must list at least one server");
  }
  for (int i = 0; i < cluster.servers_size(); ++i) {
    RETURN_IF_ERROR(
        CheckServerAddress(cluster.servers(i), i, options.allow_port_zero));
    // Two shards cannot listen on one address; port 0 addresses are distinct
    // once the servers pick their ports.
    if (absl::EndsWith(cluster.servers(i), ":0")) continue;
    for (int j = 0; j < i; ++j) {
      if (cluster.servers(j) == cluster.servers(i)) {
        return Invalid(absl::StrCat("cluster.servers[", i, "]"),
                       absl::StrCat("\"", cluster.servers(i),
                                    "\" is already cluster.servers[", j, "]"));
      }
    }
  }
  if (cluster.num_workers() < 1) {
    return Invalid("cluster.num_workers", "must be >= 1 (got 0)");
  }
  if (cluster.max_message_bytes() < kMinMaxMessageBytes ||
      cluster.max_message_bytes() > kMaxMaxMessageBytes) {
    return Invalid("cluster.max_message_bytes",
                   absl::StrCat("must be in [", kMinMaxMessageBytes, ", ",
                                kMaxMaxMessageBytes, "] (64 KiB..1 GiB) (got ",
                                cluster.max_message_bytes(), ")"));
  }
  // A chunk must not be a sliver: each is an RPC and a round of its own.
  constexpr uint32_t kMinChunkBytes = 4096;
  const uint32_t chunk_room = cluster.max_message_bytes() - kMessageOverheadBytes;
  if (cluster.chunk_bytes() != 0 &&
      (cluster.chunk_bytes() % 4 != 0 || cluster.chunk_bytes() < kMinChunkBytes ||
       cluster.chunk_bytes() > chunk_room)) {
    return Invalid("cluster.chunk_bytes",
                   absl::StrCat("must be a multiple of 4 in [", kMinChunkBytes, ", ", chunk_room,
                                "] (max_message_bytes - 1024), or 0 for the default (got ",
                                cluster.chunk_bytes(), ")"));
  }
  if (!(cluster.round_timeout_s() > 0) ||
      !std::isfinite(cluster.round_timeout_s())) {
    return Invalid("cluster.round_timeout_s",
                   absl::StrCat("must be > 0 and finite (got ",
                                FormatReal(cluster.round_timeout_s()), ")"));
  }
  if (cluster.retained_rounds() < 1) {
    return Invalid("cluster.retained_rounds", "must be >= 1 (got 0)");
  }
  if (cluster.local_size() < 1) {
    return Invalid("cluster.local_size", "must be >= 1 (got 0)");
  }
  // Ranks and process counts travel as uint32 and, in a node's group, as
  // floats, which hold every integer up to 2^24 exactly.
  constexpr uint64_t kMaxProcesses = uint64_t{1} << 24;
  if (uint64_t{cluster.num_workers()} * cluster.local_size() > kMaxProcesses) {
    return Invalid("cluster.num_workers",
                   absl::StrCat("x cluster.local_size must be at most ", kMaxProcesses,
                                " worker processes (got ", cluster.num_workers(), " x ",
                                cluster.local_size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const v1::ModelConfig& model) {
  switch (model.kind()) {
    case v1::ModelConfig::SOFTMAX:
      if (model.hidden_size() != 0) {
        return Invalid("model.hidden",
                       absl::StrCat("must be empty for a SOFTMAX model (got ",
                                    model.hidden_size(), " widths)"));
      }
      break;
    case v1::ModelConfig::MLP:
      if (model.hidden_size() == 0) {
        return Invalid("model.hidden",
                       "an MLP needs at least one hidden width");
      }
      for (int i = 0; i < model.hidden_size(); ++i) {
        if (model.hidden(i) == 0) {
          return Invalid(absl::StrCat("model.hidden[", i, "]"),
                         "must be > 0 (got 0)");
        }
      }
      break;
    case v1::ModelConfig::CNN:
    case v1::ModelConfig::FLAT:
      break;  // MakeModelSpec below checks their fields
    case v1::ModelConfig::KIND_UNSPECIFIED:
      return Invalid("model.kind", "must be set to SOFTMAX, MLP, CNN or FLAT");
    default:
      return Invalid("model.kind",
                     absl::StrCat("unknown value ", model.kind(),
                                  "; must be SOFTMAX, MLP, CNN or FLAT"));
  }
  if (model.input_dim() < 1) {
    return Invalid("model.input_dim", "must be >= 1 (got 0)");
  }
  if (model.num_classes() < 2) {
    return Invalid("model.num_classes",
                   absl::StrCat("must be >= 2 (got ", model.num_classes(), ")"));
  }
  // The layout rules (conv geometry, CNN-only fields, sizes that overflow)
  // live in one place, which the servers and workers use as well.
  ASSIGN_OR_RETURN(const ModelSpec spec, MakeModelSpec(model));
  // Far beyond any machine's memory, and far below where counts of blocks
  // and bytes would wrap.
  constexpr uint64_t kMaxParams = uint64_t{1} << 40;
  if (spec.num_params > kMaxParams) {
    return Invalid(model.kind() == v1::ModelConfig::FLAT ? "model.num_params" : "model",
                   absl::StrCat("the model has ", spec.num_params,
                                " parameters, more than 2^40 (4 TiB of floats)"));
  }
  return absl::OkStatus();
}

// How many entries a per-rank data list must have: one per worker process,
// i.e. cluster.num_workers x cluster.local_size (each local rank of a node
// has its own batch size, data partition and slowdown).
struct WorkerProcesses {
  uint64_t count = 0;
  std::string described;  // for messages
};

WorkerProcesses CountWorkerProcesses(const v1::ClusterConfig& cluster) {
  const uint64_t count = uint64_t{cluster.num_workers()} * cluster.local_size();
  if (cluster.local_size() == 1) {
    return {count, absl::StrCat("cluster.num_workers is ", cluster.num_workers())};
  }
  return {count, absl::StrCat("cluster.num_workers x cluster.local_size is ",
                              cluster.num_workers(), " x ", cluster.local_size(),
                              " = ", count)};
}

absl::Status WrongEntryCount(absl::string_view field, int size,
                             const WorkerProcesses& workers) {
  return Invalid(field, absl::StrCat("must have one entry per worker: has ", size,
                                     ", ", workers.described));
}

// A per-rank list: empty, or one finite value >= `min` (and <= `max`) per
// worker process.
absl::Status ValidatePerRank(const google::protobuf::RepeatedField<float>& values,
                             const std::string& field, const WorkerProcesses& workers,
                             float min, bool min_exclusive,
                             float max = std::numeric_limits<float>::infinity()) {
  if (values.empty()) return absl::OkStatus();
  if (static_cast<uint64_t>(values.size()) != workers.count) {
    return WrongEntryCount(field, values.size(), workers);
  }
  for (int i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || v < min || (min_exclusive && v == min) || v > max) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat("must be finite and ", min_exclusive ? "> " : ">= ", min,
                                  std::isfinite(max) ? absl::StrCat(" and <= ", max) : "",
                                  " (got ", v, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataConfig& data, const WorkerProcesses& workers) {
  // A study's straggler: a thousandfold step already outlasts any round's
  // timeout; more would sleep for ever.
  RETURN_IF_ERROR(ValidatePerRank(data.rank_slowdown(), "data.rank_slowdown",
                                  workers, 1.0f, false, 1000.0f));
  RETURN_IF_ERROR(ValidatePerRank(data.rank_speeds(), "data.rank_speeds",
                                  workers, 0.0f, true));
  if (data.rank_speeds_size() > 0 && data.rank_batch_sizes_size() > 0) {
    return Invalid("data.rank_speeds",
                   "set either rank_speeds or rank_batch_sizes, not both");
  }
  if (data.rank_batch_sizes_size() == 0) {
    if (data.batch_size() < 1) {
      return Invalid("data.batch_size",
                     "must be >= 1 (got 0) unless data.rank_batch_sizes is set");
    }
    return absl::OkStatus();
  }
  if (static_cast<uint64_t>(data.rank_batch_sizes_size()) != workers.count) {
    return WrongEntryCount("data.rank_batch_sizes", data.rank_batch_sizes_size(),
                           workers);
  }
  for (int i = 0; i < data.rank_batch_sizes_size(); ++i) {
    if (data.rank_batch_sizes(i) < 1) {
      return Invalid(absl::StrCat("data.rank_batch_sizes[", i, "]"),
                     "must be >= 1 (got 0)");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerConfig& opt,
                               uint32_t epochs) {
  if (!(opt.lr() > 0) || !std::isfinite(opt.lr())) {
    return Invalid("optimizer.lr", absl::StrCat("must be > 0 and finite (got ",
                                                FormatReal(opt.lr()), ")"));
  }
  if (!v1::OptimizerConfig::Momentum_IsValid(opt.momentum_kind())) {
    return Invalid("optimizer.momentum_kind",
                   absl::StrCat("unknown value ", opt.momentum_kind()));
  }
  if (!(opt.momentum() >= 0 && opt.momentum() < 1)) {
    return Invalid("optimizer.momentum",
                   absl::StrCat("must be in [0, 1) (got ",
                                FormatReal(opt.momentum()), ")"));
  }
  if (UsesMomentum(opt.momentum_kind()) && !(opt.momentum() > 0)) {
    return Invalid("optimizer.momentum",
                   absl::StrCat("must be > 0 when momentum_kind is ",
                                v1::OptimizerConfig::Momentum_Name(
                                    opt.momentum_kind()),
                                " (got ", FormatReal(opt.momentum()), ")"));
  }
  // A set field that the job does not read is a misunderstanding worth
  // reporting, as the algorithm's are: the job would train otherwise than
  // its config reads.
  if (!UsesMomentum(opt.momentum_kind()) && opt.momentum() != 0) {
    return Invalid("optimizer.momentum",
                   absl::StrCat("is read only with momentum_kind HEAVY_BALL or NESTEROV (got ",
                                FormatReal(opt.momentum()), " with momentum_kind ",
                                v1::OptimizerConfig::Momentum_Name(opt.momentum_kind()),
                                ", which trains without momentum)"));
  }
  if (!(opt.weight_decay() >= 0) || !std::isfinite(opt.weight_decay())) {
    return Invalid("optimizer.weight_decay",
                   absl::StrCat("must be >= 0 and finite (got ",
                                FormatReal(opt.weight_decay()), ")"));
  }
  switch (opt.schedule()) {
    case v1::OptimizerConfig::SCHEDULE_UNSPECIFIED:
    case v1::OptimizerConfig::CONSTANT:
      break;
    case v1::OptimizerConfig::STEP_DECAY:
      if (opt.step_epochs() < 1) {
        return Invalid("optimizer.step_epochs",
                       "must be >= 1 for STEP_DECAY (got 0)");
      }
      if (!(opt.gamma() > 0 && opt.gamma() <= 1)) {
        return Invalid("optimizer.gamma",
                       absl::StrCat("must be in (0, 1] for STEP_DECAY (got ",
                                    FormatReal(opt.gamma()), ")"));
      }
      break;
    case v1::OptimizerConfig::WARMUP_COSINE:
      if (!(opt.warmup_epochs() >= 0 &&
            static_cast<double>(opt.warmup_epochs()) < epochs)) {
        return Invalid("optimizer.warmup_epochs",
                       absl::StrCat("must be >= 0 and < epochs (", epochs,
                                    ") for WARMUP_COSINE (got ",
                                    FormatReal(opt.warmup_epochs()), ")"));
      }
      break;
    default:
      return Invalid("optimizer.schedule",
                     absl::StrCat("unknown value ", opt.schedule()));
  }
  const auto unread = [&](absl::string_view field, bool set,
                          v1::OptimizerConfig::Schedule reads) -> absl::Status {
    if (!set || opt.schedule() == reads) return absl::OkStatus();
    return Invalid(absl::StrCat("optimizer.", field),
                   absl::StrCat("is read only with schedule ",
                                v1::OptimizerConfig::Schedule_Name(reads), " (got schedule ",
                                v1::OptimizerConfig::Schedule_Name(opt.schedule()), ")"));
  };
  RETURN_IF_ERROR(unread("step_epochs", opt.step_epochs() != 0, v1::OptimizerConfig::STEP_DECAY));
  RETURN_IF_ERROR(unread("gamma", opt.gamma() != 0, v1::OptimizerConfig::STEP_DECAY));
  RETURN_IF_ERROR(
      unread("warmup_epochs", opt.warmup_epochs() != 0, v1::OptimizerConfig::WARMUP_COSINE));
  return absl::OkStatus();
}

// INVALID_ARGUMENT naming `field`, which needs every shard to have rounds,
// when a shard owns no block of the model (and so `consequence`).
absl::Status EveryShardOwnsABlock(const v1::JobConfig& config, absl::string_view field,
                                  absl::string_view consequence) {
  const absl::StatusOr<ModelSpec> spec = MakeModelSpec(config.model());
  if (!spec.ok()) return spec.status();
  const BlockLayout layout(spec->num_params, config.algorithm().block_size(),
                           static_cast<uint32_t>(config.cluster().servers_size()));
  uint32_t owning = 0;
  while (owning < layout.num_shards() && layout.ShardSize(owning) > 0) ++owning;
  if (owning == layout.num_shards()) return absl::OkStatus();
  return Invalid(field, absl::StrCat("shard ", owning, " of ", layout.num_shards(),
                                     " owns no block of the model (", layout.num_blocks(),
                                     " blocks of algorithm.block_size ", layout.block_size(),
                                     "), so ", consequence, ": use at most ", owning,
                                     " servers"));
}

// Whether a job of `algorithm` may lose members mid-way (cluster.elastic).
absl::Status ValidateElastic(const AlgorithmInfo& algorithm) {
  const char* why = nullptr;
  switch (algorithm.id) {
    case AlgorithmId::kAsyncSgd:
      why = "its members are not in rounds: a silent one is already left behind";
      break;
    case AlgorithmId::kGtopkSsgd:
    case AlgorithmId::kTopkSsgd:
      why = "its sparse exchange selects the top-k of a fixed set of members";
      break;
    case AlgorithmId::kCocodSgd:
    case AlgorithmId::kPipeSgd:
      why = "its averages stay in flight across steps, and rounds complete without a member "
            "only for the averages a step waits for";
      break;
    default:
      return absl::OkStatus();
  }
  return Invalid("cluster.elastic",
                 absl::StrCat("must be false with algorithm.name \"", algorithm.name, "\": ", why));
}

absl::Status ValidateCheckpoint(const v1::JobConfig& config, const AlgorithmInfo& algorithm) {
  const v1::CheckpointConfig& checkpoint = config.checkpoint();
  if (checkpoint.every_steps() == 0) {
    if (checkpoint.resume()) {
      return Invalid("checkpoint.resume", "needs checkpoint.every_steps > 0 and checkpoint.dir");
    }
    if (checkpoint.restart_on_failure()) {
      return Invalid("checkpoint.restart_on_failure",
                     "needs checkpoint.every_steps > 0 and checkpoint.dir");
    }
    return absl::OkStatus();
  }
  if (checkpoint.dir().empty()) {
    return Invalid("checkpoint.every_steps",
                   "needs checkpoint.dir, the folder every server and worker writes to");
  }
  // Its server-side momentum and staleness clocks move with the order in
  // which pushes arrive, so no checkpoint restores the same run.
  if (algorithm.id == AlgorithmId::kAsyncSgd) {
    return Invalid("checkpoint.every_steps",
                   "must be 0 with algorithm.name \"async-sgd\": its servers' state depends "
                   "on the order pushes arrive in, so it cannot be resumed exactly");
  }
  // A checkpoint is complete once every shard's file is written, and a
  // shard writes its file when a full average reaches it: never, for one
  // that owns no block.
  return EveryShardOwnsABlock(config, "checkpoint.every_steps",
                              "it writes no checkpoint file and no checkpoint would complete");
}

}  // namespace

absl::Status ValidateJobConfig(const v1::JobConfig& config,
                               ValidateOptions options) {
  // The name goes into summaries (JSON), metric labels and file names.
  for (char c : config.name()) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' &&
        c != '.') {
      return Invalid("name", absl::StrCat("may hold only letters, digits, '-', '_' and "
                                          "'.' (got \"", config.name(), "\")"));
    }
  }
  RETURN_IF_ERROR(ValidateCluster(config.cluster(), options));
  RETURN_IF_ERROR(ValidateModel(config.model()));
  RETURN_IF_ERROR(ValidateData(config.data(), CountWorkerProcesses(config.cluster())));
  // Before the optimizer: its warm-up is bounded by epochs.
  if (config.epochs() < 1) {
    return Invalid("epochs", "must be >= 1 (got 0)");
  }
  RETURN_IF_ERROR(ValidateOptimizer(config.optimizer(), config.epochs()));
  const absl::StatusOr<AlgorithmInfo> algorithm =
      FindAlgorithm(config.algorithm().name());
  if (!algorithm.ok()) {
    // The catalog's message already starts with "algorithm.name: ".
    return absl::InvalidArgumentError(algorithm.status().message());
  }
  if (config.algorithm().block_size() < 1) {
    return Invalid("algorithm.block_size", "must be >= 1 (got 0)");
  }
  // Those that exchange through the servers alone (AsyncPushPull, the
  // sparse exchange) have no intra-node form to average a node first.
  if (config.cluster().local_size() > 1 && !algorithm->runs_on_node()) {
    return Invalid("cluster.local_size",
                   absl::StrCat("must be 1 with algorithm.name \"", algorithm->name,
                                "\", which has no hierarchical (intra-node) form (got ",
                                config.cluster().local_size(), ")"));
  }
  RETURN_IF_ERROR(ValidateAlgorithm(config.algorithm(), config.optimizer()));
  if (config.cluster().elastic()) RETURN_IF_ERROR(ValidateElastic(*algorithm));
  if (config.cluster().admit_every_steps() > 0) {
    if (!config.cluster().elastic()) {
      return Invalid("cluster.admit_every_steps",
                     "needs cluster.elastic: only an elastic job drops a rank to admit back");
    }
    // A node's local ranks would have to rejoin together, each with its shards.
    if (config.cluster().local_size() > 1) {
      return Invalid("cluster.admit_every_steps",
                     absl::StrCat("needs cluster.local_size 1 (got ",
                                  config.cluster().local_size(), ")"));
    }
    // A shard drops a rank only when one of its rounds times out, and takes
    // it back only at one of its full averages.
    RETURN_IF_ERROR(EveryShardOwnsABlock(
        config, "cluster.admit_every_steps",
        "it has no rounds, never drops a rank nor takes one back, and a dropped rank could "
        "never rejoin"));
  }
  // Step t + 1's push leaves before step t's round completes: two steps
  // ahead of the newest completed one.
  if (algorithm->id == AlgorithmId::kPipeSgd && config.cluster().max_step_lag() < 2) {
    return Invalid("cluster.max_step_lag",
                   absl::StrCat("must be >= 2 with algorithm.name \"pipe-sgd\", which pushes a "
                                "step before the previous step's round completes (got ",
                                config.cluster().max_step_lag(), ")"));
  }
  // ... so step t's round must still be retained when step t + 1's
  // completes, for a retry of step t whose reply was lost.
  if (algorithm->id == AlgorithmId::kPipeSgd && config.cluster().retained_rounds() < 2) {
    return Invalid("cluster.retained_rounds",
                   absl::StrCat("must be >= 2 with algorithm.name \"pipe-sgd\", whose retry of a "
                                "step may come after the next step's round completes (got ",
                                config.cluster().retained_rounds(), ")"));
  }
  return ValidateCheckpoint(config, *algorithm);
}

}  // namespace cserps
