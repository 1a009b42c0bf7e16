// FormatReal: a float or double as the shortest decimal text that reads back
// as the same value, for messages that quote a config value (validation,
// config mismatches), so that two different values never print alike.
#ifndef CSERPS_COMMON_FORMAT_REAL_H_
#define CSERPS_COMMON_FORMAT_REAL_H_

#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"

namespace cserps {

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

}  // namespace cserps

#endif  // CSERPS_COMMON_FORMAT_REAL_H_
