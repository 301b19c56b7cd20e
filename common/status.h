// Status helpers shared by every package.
//
// Abseil 20220623 has no RETURN_IF_ERROR / ASSIGN_OR_RETURN macros; they are
// defined once here. grpc::Status and errno become absl::Status only through
// the conversion functions below.
#ifndef PSTRAIN_COMMON_STATUS_H_
#define PSTRAIN_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

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

// grpc::Status -> absl::Status (the codes share their numbering).
absl::Status FromGrpcStatus(const grpc::Status& status);

// absl::Status -> grpc::Status.
grpc::Status ToGrpcStatus(const absl::Status& status);

// errno -> absl::Status with `context` (for example the file name) first.
absl::Status ErrnoToStatus(int error_number, absl::string_view context);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STATUS_H_
