// Status helpers for the RPC layers: common/status_macros.h (the
// RETURN_IF_ERROR and ASSIGN_OR_RETURN macros, errno to absl::Status) and
// the conversions between grpc::Status and absl::Status. Code without RPC
// includes common/status_macros.h and does not link gRPC.
#ifndef PSTRAIN_COMMON_STATUS_H_
#define PSTRAIN_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace pstrain {

// grpc::Status -> absl::Status (the codes share their numbering).
absl::Status FromGrpcStatus(const grpc::Status& status);

// absl::Status -> grpc::Status.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_STATUS_H_
