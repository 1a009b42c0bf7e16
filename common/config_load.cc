#include "common/config_load.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config_defaults.h"
#include "common/config_override.h"
#include "common/status.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace cserps {
namespace {

namespace pb = ::google::protobuf;

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

absl::StatusOr<v1::JobConfig> LoadJobWithOverrides(
    const std::string& path, const std::vector<std::string>& overrides,
    ValidateOptions validate_options) {
  if (path.empty()) {
    return absl::InvalidArgumentError("--config: a job config file is required");
  }
  ASSIGN_OR_RETURN(v1::JobConfig config, LoadJobConfig(path));
  for (const std::string& assignment : overrides) {
    absl::Status status = ApplyOverride(&config, assignment);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("--set ", assignment, ": ", status.message()));
    }
  }
  ApplyDefaults(&config);
  absl::Status valid = ValidateJobConfig(config, validate_options);
  if (!valid.ok()) {
    // The value may be the override's (--set, or a start flag's), not the
    // file's.
    return absl::Status(
        valid.code(),
        absl::StrCat(path,
                     overrides.empty() ? "" : " with its overrides (--set, --resume, "
                                              "--restart_on_failure)",
                     ": ", valid.message()));
  }
  return config;
}

}  // namespace cserps
