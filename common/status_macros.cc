#include "common/status_macros.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::Status ErrnoToStatus(int error_number, absl::string_view context) {
  const std::string message =
      absl::StrCat(context, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EADDRINUSE:
    case ECONNREFUSED:
    case ECONNRESET:
    case EAGAIN:
      return absl::UnavailableError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace pstrain
