// Status helpers shared by every module. Debian's Abseil (20220623) has no
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so they are defined once here.
#ifndef CSERPS_COMMON_STATUS_H_
#define CSERPS_COMMON_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CSERPS_CONCAT_INNER_(a, b) a##b
#define CSERPS_CONCAT_(a, b) CSERPS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status cserps_status_ = (expr);            \
    if (!cserps_status_.ok()) return cserps_status_;   \
  } while (0)

// `lhs = value of expr`, or returns its status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr) \
  CSERPS_ASSIGN_OR_RETURN_IMPL_(CSERPS_CONCAT_(cserps_statusor_, __LINE__), lhs, expr)
#define CSERPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

// Aborts on a programmer error (a broken invariant), never on bad input.
#define CSERPS_CHECK(cond)                                                  \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                  \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

#endif  // CSERPS_COMMON_STATUS_H_
