// Early-return helpers for absl::Status / absl::StatusOr. Our Abseil
// (20220623) ships neither RETURN_IF_ERROR nor ASSIGN_OR_RETURN.
#ifndef ZO_COMMON_STATUS_MACROS_H_
#define ZO_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status from the enclosing function when `expr` is not OK.
#define ZO_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status zo_status_ = (expr);      \
    if (!zo_status_.ok()) return zo_status_; \
  } while (false)

#define ZO_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define ZO_STATUS_MACROS_CONCAT_(x, y) ZO_STATUS_MACROS_CONCAT_INNER_(x, y)

// `ZO_ASSIGN_OR_RETURN(auto x, Foo());` declares x from a StatusOr or returns
// its error.
#define ZO_ASSIGN_OR_RETURN(lhs, rexpr) \
  ZO_ASSIGN_OR_RETURN_IMPL_(ZO_STATUS_MACROS_CONCAT_(zo_statusor_, __LINE__), lhs, rexpr)

#define ZO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)    \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // ZO_COMMON_STATUS_MACROS_H_
