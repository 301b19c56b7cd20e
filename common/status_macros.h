// Status helpers for code that has no RPC: the RETURN_IF_ERROR and
// ASSIGN_OR_RETURN macros (Abseil 20220623 has none) and errno to
// absl::Status. Depends on Abseil alone; common/status.h adds the gRPC
// conversions for the RPC layers.
#ifndef PSTRAIN_COMMON_STATUS_MACROS_H_
#define PSTRAIN_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define PSTRAIN_CONCAT_INNER_(a, b) a##b
#define PSTRAIN_CONCAT_(a, b) PSTRAIN_CONCAT_INNER_(a, b)

// Returns early from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status _pstrain_status = (expr);           \
    if (!_pstrain_status.ok()) return _pstrain_status; \
  } while (0)

// `lhs = *expr` if `expr` (an absl::StatusOr) is OK; otherwise returns its
// status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, expr)                                         \
  ASSIGN_OR_RETURN_IMPL_(PSTRAIN_CONCAT_(_pstrain_statusor, __LINE__), lhs, \
                         expr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

namespace pstrain {

// errno -> absl::Status with `context` (for example the file name) first:
// ENOENT NOT_FOUND, EACCES and EPERM PERMISSION_DENIED, EADDRINUSE,
// ECONNREFUSED, ECONNRESET and EAGAIN UNAVAILABLE, EINVAL INVALID_ARGUMENT,
// anything else INTERNAL; the message is "<context>: <strerror>".
absl::Status ErrnoToStatus(int error_number, absl::string_view context);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STATUS_MACROS_H_
