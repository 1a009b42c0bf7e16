#include "common/config_fingerprint.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_defaults.h"
#include "common/format_real.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"

namespace cserps {
namespace {

namespace pb = ::google::protobuf;

// Defaults applied and local fields cleared; servers keep their count.
v1::JobConfig Normalised(const v1::JobConfig& config) {
  v1::JobConfig copy = config;
  ApplyDefaults(&copy);
  for (std::string& server : *copy.mutable_cluster()->mutable_servers()) {
    server.clear();
  }
  copy.mutable_data()->clear_dir();
  copy.clear_log_every_steps();
  copy.clear_evals_per_epoch();
  copy.mutable_cluster()->clear_transport();
  copy.clear_output_dir();
  copy.clear_security();
  v1::CheckpointConfig* checkpoint = copy.mutable_checkpoint();
  checkpoint->clear_dir();
  checkpoint->clear_keep();
  checkpoint->clear_resume();
  checkpoint->clear_restart_on_failure();
  if (checkpoint->every_steps() == 0) copy.clear_checkpoint();
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

// Element `index` of `field` (the singular value when index < 0), read with
// the Reflection getters of the field's type.
template <typename T>
T FieldValue(const pb::Message& message, const pb::FieldDescriptor* field,
             int index,
             T (pb::Reflection::*get)(const pb::Message&,
                                      const pb::FieldDescriptor*) const,
             T (pb::Reflection::*get_repeated)(const pb::Message&,
                                               const pb::FieldDescriptor*, int)
                 const) {
  const pb::Reflection* r = message.GetReflection();
  return index >= 0 ? (r->*get_repeated)(message, field, index)
                    : (r->*get)(message, field);
}

// FieldValue as text.
std::string FieldValueText(const pb::Message& message,
                           const pb::FieldDescriptor* field, int index) {
  using R = pb::Reflection;
  const auto value = [&](auto get, auto get_repeated) {
    return FieldValue(message, field, index, get, get_repeated);
  };
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(value(&R::GetInt32, &R::GetRepeatedInt32));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(value(&R::GetInt64, &R::GetRepeatedInt64));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(value(&R::GetUInt32, &R::GetRepeatedUInt32));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(value(&R::GetUInt64, &R::GetRepeatedUInt64));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return FormatReal(value(&R::GetFloat, &R::GetRepeatedFloat));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return FormatReal(value(&R::GetDouble, &R::GetRepeatedDouble));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return value(&R::GetBool, &R::GetRepeatedBool) ? "true" : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const int number = value(&R::GetEnumValue, &R::GetRepeatedEnumValue);
      const pb::EnumValueDescriptor* name =
          field->enum_type()->FindValueByNumber(number);
      return name != nullptr ? name->name() : absl::StrCat(number);
    }
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return absl::StrCat(
          "\"", absl::CHexEscape(value(&R::GetString, &R::GetRepeatedString)),
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
  using R = pb::Reflection;
  const auto same_bits = [&](auto get, auto get_repeated) {
    const auto x = FieldValue(a, field, index, get, get_repeated);
    const auto y = FieldValue(b, field, index, get, get_repeated);
    return std::memcmp(&x, &y, sizeof(x)) == 0;
  };
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return same_bits(&R::GetFloat, &R::GetRepeatedFloat);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return same_bits(&R::GetDouble, &R::GetRepeatedDouble);
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
