// libFuzzer target: the job config as every binary reads it. The input is a
// text-format config, then optionally a NUL and a "--set" flag value; the
// config is parsed, overridden, defaulted, validated, fingerprinted and
// compared with itself. Every step must return a status, never crash, and
// a config must compare equal to itself and keep its fingerprint.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const absl::string_view text = input.substr(0, nul);
  absl::StatusOr<cserps::v1::JobConfig> config = cserps::ParseJobConfig(text, "fuzz");
  if (!config.ok()) return 0;
  if (nul != absl::string_view::npos) {
    for (const std::string& assignment : cserps::SplitOverrides(input.substr(nul + 1))) {
      (void)cserps::ApplyOverride(&*config, assignment).ok();
    }
  }
  cserps::ApplyDefaults(&*config);
  if (!cserps::ValidateJobConfig(*config, {.allow_port_zero = true}).ok()) return 0;
  const uint64_t fingerprint = cserps::JobFingerprint(*config);
  cserps::v1::JobConfig copy = *config;
  if (!cserps::CompareJobConfigs(*config, copy, "a", "b").ok() ||
      cserps::JobFingerprint(copy) != fingerprint) {
    std::abort();  // a config that differs from itself
  }
  return 0;
}
