// The files of a secured job, made by tools/make_certs.sh for a test.
#ifndef CSERPS_TESTS_TESTING_JOB_CERTIFICATES_H_
#define CSERPS_TESTS_TESTING_JOB_CERTIFICATES_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace cserps::testing {

// A new CA, server and client certificates and a token in `dir` (replacing
// what is there), with the script of the source tree `source_dir`; false
// when the script failed.
inline bool MakeJobCertificates(const std::string& source_dir, const std::string& dir) {
  const std::string command =
      absl::StrCat("bash ", source_dir, "/tools/make_certs.sh --force ", dir, " > /dev/null");
  return std::system(command.c_str()) == 0;
}

}  // namespace cserps::testing

#endif  // CSERPS_TESTS_TESTING_JOB_CERTIFICATES_H_
