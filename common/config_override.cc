#include "common/config_override.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cserps {
namespace {

namespace pb = ::google::protobuf;

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

absl::StatusOr<bool> ParseBool(absl::string_view where, absl::string_view value) {
  bool parsed;
  if (!absl::SimpleAtob(value, &parsed)) {
    return BadValue(where, value, "a bool (true or false)");
  }
  return parsed;
}

// By the value's name as written, else upper-cased.
absl::StatusOr<const pb::EnumValueDescriptor*> ParseEnum(
    absl::string_view where, absl::string_view value,
    const pb::EnumDescriptor& type) {
  const pb::EnumValueDescriptor* parsed = type.FindValueByName(std::string(value));
  if (parsed == nullptr) {
    parsed = type.FindValueByName(absl::AsciiStrToUpper(value));
  }
  if (parsed == nullptr) {
    return BadValue(where, value,
                    absl::StrCat("a value of ", type.name(), " (one of ",
                                 EnumNames(type), ")"));
  }
  return parsed;
}

// Sets (or, with `add`, appends to) `field` of `message` from `value`.
absl::Status SetFromText(pb::Message* message, const pb::FieldDescriptor* field,
                         absl::string_view value, bool add,
                         absl::string_view where) {
  using R = pb::Reflection;
  const R* reflection = message->GetReflection();
  // `add_fn` and `set_fn` are the Reflection members for the field's type.
  const auto store = [&](auto parsed, auto add_fn, auto set_fn) -> absl::Status {
    if (!parsed.ok()) return parsed.status();
    (reflection->*(add ? add_fn : set_fn))(message, field, *std::move(parsed));
    return absl::OkStatus();
  };
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return store(ParseInteger<int32_t>(where, value, "int32"), &R::AddInt32,
                   &R::SetInt32);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return store(ParseInteger<int64_t>(where, value, "int64"), &R::AddInt64,
                   &R::SetInt64);
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return store(ParseInteger<uint32_t>(where, value, "uint32"), &R::AddUInt32,
                   &R::SetUInt32);
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return store(ParseInteger<uint64_t>(where, value, "uint64"), &R::AddUInt64,
                   &R::SetUInt64);
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return store(ParseReal<float>(where, value, "float"), &R::AddFloat,
                   &R::SetFloat);
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return store(ParseReal<double>(where, value, "double"), &R::AddDouble,
                   &R::SetDouble);
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return store(ParseBool(where, value), &R::AddBool, &R::SetBool);
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return store(ParseEnum(where, value, *field->enum_type()), &R::AddEnum,
                   &R::SetEnum);
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return store(absl::StatusOr<std::string>(std::string(value)),
                   &R::AddString, &R::SetString);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": is a message; assign its fields instead"));
}

absl::Status MalformedOverride(absl::string_view assignment,
                               absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      "override \"", absl::CHexEscape(assignment), "\": ", problem));
}

}  // namespace

std::vector<std::string> SplitOverrides(absl::string_view flag) {
  return absl::StrSplit(flag, ';', absl::SkipWhitespace());
}

std::optional<std::string> RepeatedSetFlags(int argc, char** argv) {
  std::vector<std::string> values;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    absl::string_view name = arg;
    if (!absl::ConsumePrefix(&name, "--")) absl::ConsumePrefix(&name, "-");
    if (name == "set" && i + 1 < argc) {
      values.push_back(argv[++i]);
    } else if (absl::ConsumePrefix(&name, "set=")) {
      values.emplace_back(name);
    }
  }
  if (values.size() < 2) return std::nullopt;
  return absl::StrJoin(values, ";");
}

absl::Status ApplyOverride(v1::JobConfig* config, absl::string_view assignment) {
  const size_t equals = assignment.find('=');
  if (equals == absl::string_view::npos) {
    return MalformedOverride(assignment, "expected field.path=value");
  }
  const absl::string_view path =
      absl::StripAsciiWhitespace(assignment.substr(0, equals));
  const absl::string_view value = assignment.substr(equals + 1);
  if (path.empty()) {
    return MalformedOverride(assignment, "missing field path before '='");
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

}  // namespace cserps
