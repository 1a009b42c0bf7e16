#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/algorithm_catalog.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"

namespace cserps {
namespace {

namespace pb = ::google::protobuf;

constexpr uint32_t kDefaultMaxMessageBytes = 4u << 20;
constexpr uint32_t kMinMaxMessageBytes = 64u << 10;
constexpr uint32_t kMaxMaxMessageBytes = 1u << 30;

// Keeps the first error only: later ones are usually consequences of it.
class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column,
                const std::string& message) override {
    if (has_error_) return;
    has_error_ = true;
    line_ = line;
    column_ = column;
    message_ = message;
  }

  bool has_error() const { return has_error_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

// The shortest decimal form that reads back as the same value, so that two
// different values never print alike in a mismatch message.
template <typename T>
std::string FormatReal(T value) {
  const int max_digits = std::numeric_limits<T>::max_digits10;
  std::string text;
  for (int digits = 6; digits <= max_digits; ++digits) {
    text = absl::StrFormat("%.*g", digits, value);
    if (static_cast<T>(std::strtod(text.c_str(), nullptr)) == value) break;
  }
  return text;
}

// ---------------------------------------------------------------------------
// ApplyOverride

std::string FieldNames(const pb::Descriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.field_count(); ++i) {
    names.push_back(descriptor.field(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

std::string EnumNames(const pb::EnumDescriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.value_count(); ++i) {
    names.push_back(descriptor.value(i)->name());
  }
  return absl::StrJoin(names, ", ");
}

absl::Status BadValue(absl::string_view where, absl::string_view value,
                      absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": \"", absl::CHexEscape(value), "\" is not ", what));
}

template <typename T>
absl::StatusOr<T> ParseInteger(absl::string_view where, absl::string_view value,
                               absl::string_view type_name) {
  T parsed;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return BadValue(where, value,
                    absl::StrCat("a ", type_name, " (",
                                 std::numeric_limits<T>::min(), "..",
                                 std::numeric_limits<T>::max(), ")"));
  }
  return parsed;
}

template <typename T>
absl::StatusOr<T> ParseReal(absl::string_view where, absl::string_view value,
                            absl::string_view type_name) {
  double parsed;
  if (!absl::SimpleAtod(value, &parsed)) {
    return BadValue(where, value, absl::StrCat("a ", type_name));
  }
  // SimpleAtod turns an overflow into infinity; only an explicit "inf" may
  // produce one.
  const std::string lower = absl::AsciiStrToLower(value);
  const bool spelled_special = absl::StrContains(lower, "inf") ||
                               absl::StrContains(lower, "nan");
  if (std::isfinite(parsed)
          ? std::fabs(parsed) > std::numeric_limits<T>::max()
          : !spelled_special) {
    return BadValue(where, value, absl::StrCat("in the range of a ", type_name));
  }
  return static_cast<T>(parsed);
}

// Sets (or, with `add`, appends to) `field` of `message` from `value`.
absl::Status SetFromText(pb::Message* message, const pb::FieldDescriptor* field,
                         absl::string_view value, bool add,
                         absl::string_view where) {
  const pb::Reflection* reflection = message->GetReflection();
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      ASSIGN_OR_RETURN(int32_t v, ParseInteger<int32_t>(where, value, "int32"));
      add ? reflection->AddInt32(message, field, v)
          : reflection->SetInt32(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      ASSIGN_OR_RETURN(int64_t v, ParseInteger<int64_t>(where, value, "int64"));
      add ? reflection->AddInt64(message, field, v)
          : reflection->SetInt64(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      ASSIGN_OR_RETURN(uint32_t v,
                       ParseInteger<uint32_t>(where, value, "uint32"));
      add ? reflection->AddUInt32(message, field, v)
          : reflection->SetUInt32(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      ASSIGN_OR_RETURN(uint64_t v,
                       ParseInteger<uint64_t>(where, value, "uint64"));
      add ? reflection->AddUInt64(message, field, v)
          : reflection->SetUInt64(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      ASSIGN_OR_RETURN(float v, ParseReal<float>(where, value, "float"));
      add ? reflection->AddFloat(message, field, v)
          : reflection->SetFloat(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      ASSIGN_OR_RETURN(double v, ParseReal<double>(where, value, "double"));
      add ? reflection->AddDouble(message, field, v)
          : reflection->SetDouble(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      bool v;
      if (!absl::SimpleAtob(value, &v)) {
        return BadValue(where, value, "a bool (true or false)");
      }
      add ? reflection->AddBool(message, field, v)
          : reflection->SetBool(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor* type = field->enum_type();
      const pb::EnumValueDescriptor* v = type->FindValueByName(std::string(value));
      if (v == nullptr) {
        v = type->FindValueByName(absl::AsciiStrToUpper(value));
      }
      if (v == nullptr) {
        return BadValue(where, value,
                        absl::StrCat("a value of ", type->name(), " (one of ",
                                     EnumNames(*type), ")"));
      }
      add ? reflection->AddEnum(message, field, v)
          : reflection->SetEnum(message, field, v);
      return absl::OkStatus();
    }
    case pb::FieldDescriptor::CPPTYPE_STRING:
      add ? reflection->AddString(message, field, std::string(value))
          : reflection->SetString(message, field, std::string(value));
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": is a message; assign its fields instead"));
}

// ---------------------------------------------------------------------------
// ValidateJobConfig

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
      break;  // MakeModelSpec below checks the conv fields
    case v1::ModelConfig::KIND_UNSPECIFIED:
      return Invalid("model.kind", "must be set to SOFTMAX, MLP or CNN");
    default:
      return Invalid("model.kind",
                     absl::StrCat("unknown value ", model.kind(),
                                  "; must be SOFTMAX, MLP or CNN"));
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
  return MakeModelSpec(model).status();
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

// A per-rank list: empty, or one finite value >= `min` per worker process.
absl::Status ValidatePerRank(const google::protobuf::RepeatedField<float>& values,
                             const std::string& field, const WorkerProcesses& workers,
                             float min, bool min_exclusive) {
  if (values.empty()) return absl::OkStatus();
  if (static_cast<uint64_t>(values.size()) != workers.count) {
    return Invalid(field, absl::StrCat("must have one entry per worker: has ",
                                       values.size(), ", ", workers.described));
  }
  for (int i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || v < min || (min_exclusive && v == min)) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat("must be finite and ", min_exclusive ? "> " : ">= ",
                                  min, " (got ", v, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const v1::DataConfig& data, const WorkerProcesses& workers) {
  RETURN_IF_ERROR(ValidatePerRank(data.rank_slowdown(), "data.rank_slowdown",
                                  workers, 1.0f, false));
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
    if (data.rank_speeds_size() > 0 &&
        uint64_t{data.batch_size()} * workers.count < workers.count) {
      return Invalid("data.batch_size", "too small to give every rank an example");
    }
    return absl::OkStatus();
  }
  if (static_cast<uint64_t>(data.rank_batch_sizes_size()) != workers.count) {
    return Invalid("data.rank_batch_sizes",
                   absl::StrCat("must have one entry per worker: has ",
                                data.rank_batch_sizes_size(), ", ", workers.described));
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
  const bool uses_momentum =
      opt.momentum_kind() == v1::OptimizerConfig::HEAVY_BALL ||
      opt.momentum_kind() == v1::OptimizerConfig::NESTEROV;
  if (uses_momentum && !(opt.momentum() > 0)) {
    return Invalid("optimizer.momentum",
                   absl::StrCat("must be > 0 when momentum_kind is ",
                                v1::OptimizerConfig::Momentum_Name(
                                    opt.momentum_kind()),
                                " (got ", FormatReal(opt.momentum()), ")"));
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
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// JobFingerprint and CompareJobConfigs

// Defaults applied and local fields cleared; servers keep their count.
v1::JobConfig Normalised(const v1::JobConfig& config) {
  v1::JobConfig copy = config;
  ApplyDefaults(&copy);
  for (std::string& server : *copy.mutable_cluster()->mutable_servers()) {
    server.clear();
  }
  copy.mutable_data()->clear_dir();
  copy.clear_log_every_steps();
  copy.clear_output_dir();
  return copy;
}

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

uint64_t NormalisedFingerprint(const v1::JobConfig& normalised) {
  std::string bytes;
  {
    pb::io::StringOutputStream raw(&bytes);
    pb::io::CodedOutputStream coded(&raw);
    coded.SetSerializationDeterministic(true);
    CSERPS_CHECK(normalised.SerializeToCodedStream(&coded));
  }  // The coded stream trims `bytes` when it goes away.
  return Fnv1a64(bytes);
}

// Element `index` of `field` (or the singular value when index < 0) as text.
std::string FieldValueText(const pb::Message& message,
                           const pb::FieldDescriptor* field, int index) {
  const pb::Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(rep ? r->GetRepeatedInt32(message, field, index)
                              : r->GetInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r->GetRepeatedInt64(message, field, index)
                              : r->GetInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(rep ? r->GetRepeatedUInt32(message, field, index)
                              : r->GetUInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r->GetRepeatedUInt64(message, field, index)
                              : r->GetUInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return FormatReal(rep ? r->GetRepeatedFloat(message, field, index)
                            : r->GetFloat(message, field));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return FormatReal(rep ? r->GetRepeatedDouble(message, field, index)
                            : r->GetDouble(message, field));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(message, field, index)
                  : r->GetBool(message, field))
                 ? "true"
                 : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const int number = rep ? r->GetRepeatedEnumValue(message, field, index)
                             : r->GetEnumValue(message, field);
      const pb::EnumValueDescriptor* value =
          field->enum_type()->FindValueByNumber(number);
      return value != nullptr ? value->name() : absl::StrCat(number);
    }
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return absl::StrCat(
          "\"",
          absl::CHexEscape(rep ? r->GetRepeatedString(message, field, index)
                               : r->GetString(message, field)),
          "\"");
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "<message>";
}

std::string FieldText(const pb::Message& message,
                      const pb::FieldDescriptor* field) {
  if (!field->is_repeated()) return FieldValueText(message, field, -1);
  std::vector<std::string> items;
  const int size = message.GetReflection()->FieldSize(message, field);
  for (int i = 0; i < size; ++i) {
    items.push_back(FieldValueText(message, field, i));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

// Scalars compare by their bits for floats, as the wire format does: NaN
// equals itself and -0 differs from 0, exactly when the fingerprints agree.
bool FieldValuesEqual(const pb::Message& a, const pb::Message& b,
                      const pb::FieldDescriptor* field, int index) {
  const pb::Reflection* ra = a.GetReflection();
  const pb::Reflection* rb = b.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const float x = rep ? ra->GetRepeatedFloat(a, field, index)
                          : ra->GetFloat(a, field);
      const float y = rep ? rb->GetRepeatedFloat(b, field, index)
                          : rb->GetFloat(b, field);
      return std::memcmp(&x, &y, sizeof(x)) == 0;
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      const double x = rep ? ra->GetRepeatedDouble(a, field, index)
                           : ra->GetDouble(a, field);
      const double y = rep ? rb->GetRepeatedDouble(b, field, index)
                           : rb->GetDouble(b, field);
      return std::memcmp(&x, &y, sizeof(x)) == 0;
    }
    default:
      // Every other type prints without loss.
      return FieldValueText(a, field, index) == FieldValueText(b, field, index);
  }
}

struct Mismatch {
  std::string path;
  std::string mine;
  std::string theirs;
};

std::string Entries(int n) {
  return absl::StrCat(n, n == 1 ? " entry" : " entries");
}

std::optional<Mismatch> FirstMismatch(const pb::Message& a,
                                      const pb::Message& b,
                                      const std::string& prefix) {
  const pb::Descriptor* descriptor = a.GetDescriptor();
  const pb::Reflection* ra = a.GetReflection();
  const pb::Reflection* rb = b.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
    const std::string path = absl::StrCat(prefix, field->name());
    if (field->is_repeated()) {
      const int size_a = ra->FieldSize(a, field);
      const int size_b = rb->FieldSize(b, field);
      if (path == "cluster.servers") {
        // Only the count survives normalisation.
        if (size_a != size_b) {
          return Mismatch{path, Entries(size_a), Entries(size_b)};
        }
        continue;
      }
      CSERPS_CHECK(field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE);
      bool equal = size_a == size_b;
      for (int j = 0; equal && j < size_a; ++j) {
        equal = FieldValuesEqual(a, b, field, j);
      }
      if (!equal) return Mismatch{path, FieldText(a, field), FieldText(b, field)};
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      std::optional<Mismatch> inner =
          FirstMismatch(ra->GetMessage(a, field), rb->GetMessage(b, field),
                        absl::StrCat(path, "."));
      if (inner.has_value()) return inner;
    } else if (!FieldValuesEqual(a, b, field, -1)) {
      return Mismatch{path, FieldText(a, field), FieldText(b, field)};
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<v1::JobConfig> ParseJobConfig(absl::string_view text,
                                             absl::string_view source_name) {
  v1::JobConfig config;
  FirstErrorCollector errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    if (!errors.has_error()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": not a valid JobConfig text proto"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", errors.line() + 1, ":",
                     errors.column() + 1, ": ", errors.message()));
  }
  return config;
}

absl::StatusOr<v1::JobConfig> LoadJobConfig(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat("job config ", path, ": cannot open: ",
                                     std::strerror(error)));
  }
  std::string text;
  char buffer[1 << 14];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
    text.append(buffer, n);
  }
  const int error = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (error != 0) {
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat("job config ", path, ": cannot read: ",
                                     std::strerror(error)));
  }
  return ParseJobConfig(text, path);
}

absl::Status ApplyOverride(v1::JobConfig* config, absl::string_view assignment) {
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("override \"", absl::CHexEscape(assignment),
                     "\": expected field.path=value"));
  }
  const absl::string_view path =
      absl::StripAsciiWhitespace(assignment.substr(0, equals));
  const absl::string_view value = assignment.substr(equals + 1);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("override \"", absl::CHexEscape(assignment),
                     "\": missing field path before '='"));
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');

  // Work on a copy so that a failed override leaves `config` untouched.
  v1::JobConfig updated = *config;
  pb::Message* message = &updated;
  const pb::FieldDescriptor* field = nullptr;
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor* descriptor = message->GetDescriptor();
    const std::string parent = walked.empty() ? "JobConfig" : walked;
    absl::StrAppend(&walked, i == 0 ? "" : ".", parts[i]);
    field = descriptor->FindFieldByName(std::string(parts[i]));
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unknown field \"", walked, "\"; fields of ",
                       parent, ": ", FieldNames(*descriptor)));
    }
    if (i + 1 == parts.size()) break;
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE ||
        field->is_repeated()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", walked, "\" is not a message"));
    }
    message = message->GetReflection()->MutableMessage(message, field);
  }

  if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is a message; assign one of its fields (",
        FieldNames(*field->message_type()), ")"));
  }
  if (field->is_repeated()) {
    message->GetReflection()->ClearField(message, field);
    if (!absl::StripAsciiWhitespace(value).empty()) {
      const std::vector<absl::string_view> items = absl::StrSplit(value, ',');
      for (size_t i = 0; i < items.size(); ++i) {
        RETURN_IF_ERROR(SetFromText(message, field,
                                    absl::StripAsciiWhitespace(items[i]),
                                    /*add=*/true,
                                    absl::StrCat(path, "[", i, "]")));
      }
    }
  } else {
    const absl::string_view text =
        field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING
            ? value
            : absl::StripAsciiWhitespace(value);
    RETURN_IF_ERROR(SetFromText(message, field, text, /*add=*/false, path));
  }
  *config = std::move(updated);
  return absl::OkStatus();
}

void ApplyDefaults(v1::JobConfig* config) {
  v1::ClusterConfig* cluster = config->mutable_cluster();
  if (cluster->max_message_bytes() == 0) {
    cluster->set_max_message_bytes(kDefaultMaxMessageBytes);
  }
  if (cluster->round_timeout_s() == 0) cluster->set_round_timeout_s(60);
  if (cluster->max_step_lag() == 0) cluster->set_max_step_lag(8);
  if (cluster->retained_rounds() == 0) cluster->set_retained_rounds(4);
  if (cluster->local_size() == 0) cluster->set_local_size(1);

  v1::ModelConfig* model = config->mutable_model();
  // Only a CNN gets the conv defaults: other kinds must leave them unset, and
  // their fingerprints stay what they were before CNNs existed.
  if (model->kind() == v1::ModelConfig::CNN) {
    if (model->conv_channels_size() == 0) {
      for (uint32_t c : kDefaultConvChannels) model->add_conv_channels(c);
    }
    if (model->kernel_size() == 0) model->set_kernel_size(kDefaultKernelSize);
    if (model->image_height() == 0) {
      model->set_image_height(kDefaultImageHeight);
    }
    if (model->image_width() == 0) model->set_image_width(kDefaultImageWidth);
    if (model->image_channels() == 0) {
      model->set_image_channels(kDefaultImageChannels);
    }
    // A wrapped product is left for validation to report as a mismatch.
    if (model->input_dim() == 0) {
      model->set_input_dim(model->image_height() * model->image_width() *
                           model->image_channels());
    }
  }
  if (model->input_dim() == 0) model->set_input_dim(784);
  if (model->num_classes() == 0) model->set_num_classes(10);

  v1::DataConfig* data = config->mutable_data();
  if (data->dir().empty()) data->set_dir("/usr/share/datasets/fashion-mnist");

  v1::OptimizerConfig* optimizer = config->mutable_optimizer();
  if (optimizer->momentum_kind() == v1::OptimizerConfig::MOMENTUM_UNSPECIFIED) {
    optimizer->set_momentum_kind(v1::OptimizerConfig::NONE);
  }
  if (optimizer->schedule() == v1::OptimizerConfig::SCHEDULE_UNSPECIFIED) {
    optimizer->set_schedule(v1::OptimizerConfig::CONSTANT);
  }

  v1::AlgorithmConfig* algorithm = config->mutable_algorithm();
  if (algorithm->name().empty()) algorithm->set_name("ssgd");
  if (algorithm->block_size() == 0) algorithm->set_block_size(1024);

  if (config->log_every_steps() == 0) config->set_log_every_steps(50);
  if (config->output_dir().empty()) config->set_output_dir("out");
}

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
  // These exchange through the servers alone (AsyncPushPull, the sparse
  // exchange): there is no intra-node form of them to average a node first.
  if (config.cluster().local_size() > 1) {
    for (const char* flat_only : {"async-sgd", "gtopk-ssgd", "topk-ssgd"}) {
      if (config.algorithm().name() == flat_only) {
        return Invalid("cluster.local_size",
                       absl::StrCat("must be 1 with algorithm.name \"", flat_only,
                                    "\", which has no hierarchical (intra-node) form (got ",
                                    config.cluster().local_size(), ")"));
      }
    }
  }
  return ValidateAlgorithm(config.algorithm(), config.optimizer());
}

namespace {
// cluster.local_size, where a config without defaults leaves it 0.
uint32_t LocalSize(const v1::JobConfig& config) {
  return std::max<uint32_t>(1, config.cluster().local_size());
}
}  // namespace

std::vector<uint32_t> RankBatchSizes(const v1::JobConfig& config) {
  const v1::DataConfig& data = config.data();
  if (data.rank_batch_sizes_size() > 0) {
    return {data.rank_batch_sizes().begin(), data.rank_batch_sizes().end()};
  }
  if (data.rank_speeds_size() > 0) {
    // Proportional sampling: the total of (worker processes) * batch_size
    // split in proportion to the speeds by largest remainder (ties to the
    // lower rank), each rank at least 1.
    const uint32_t n = config.cluster().num_workers() * LocalSize(config);
    const uint64_t total = uint64_t{data.batch_size()} * n;
    double speed_sum = 0;
    for (float s : data.rank_speeds()) speed_sum += s;
    std::vector<uint32_t> sizes(n);
    std::vector<std::pair<double, uint32_t>> remainders;
    uint64_t given = 0;
    for (uint32_t r = 0; r < n; ++r) {
      const double exact = total * (data.rank_speeds(r) / speed_sum);
      sizes[r] = static_cast<uint32_t>(exact);
      given += sizes[r];
      remainders.push_back({-(exact - sizes[r]), r});
    }
    std::sort(remainders.begin(), remainders.end());
    for (uint64_t i = 0; given < total; ++i, ++given) ++sizes[remainders[i % n].second];
    for (uint32_t& s : sizes) s = std::max<uint32_t>(s, 1);
    return sizes;
  }
  return std::vector<uint32_t>(config.cluster().num_workers() * LocalSize(config),
                               data.batch_size());
}

uint64_t JobFingerprint(const v1::JobConfig& config) {
  return NormalisedFingerprint(Normalised(config));
}

absl::Status CompareJobConfigs(const v1::JobConfig& mine,
                               const v1::JobConfig& theirs,
                               absl::string_view mine_label,
                               absl::string_view theirs_label) {
  const v1::JobConfig a = Normalised(mine);
  const v1::JobConfig b = Normalised(theirs);
  const std::optional<Mismatch> mismatch = FirstMismatch(a, b, "");
  if (mismatch.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config mismatch at ", mismatch->path, ": ", mine_label, " has ",
        mismatch->mine, ", ", theirs_label, " has ", mismatch->theirs));
  }
  // Known fields agree; only fields this build cannot name (a config parsed
  // from a newer schema's wire bytes) can still differ.
  if (NormalisedFingerprint(a) != NormalisedFingerprint(b)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config mismatch in fields unknown to this build (a newer config "
        "schema on ",
        mine_label, " or ", theirs_label, "?)"));
  }
  return absl::OkStatus();
}

}  // namespace cserps
