#ifndef CSERPS_COMMON_SPLIT_OVERRIDES_H_
#define CSERPS_COMMON_SPLIT_OVERRIDES_H_

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace cserps {

// "--set" takes assignments separated by ';' because list values use ','.
inline std::vector<std::string> SplitOverrides(absl::string_view flag) {
  return absl::StrSplit(flag, ';', absl::SkipWhitespace());
}

}  // namespace cserps

#endif  // CSERPS_COMMON_SPLIT_OVERRIDES_H_
