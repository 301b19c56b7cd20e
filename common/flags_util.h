// Small helpers for the binaries' command lines.
#ifndef PSTRAIN_COMMON_FLAGS_UTIL_H_
#define PSTRAIN_COMMON_FLAGS_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// Writes `contents` to `path` atomically and durably (a temporary file in
// the same folder, fsynced, renamed over `path`, then the folder fsynced), so
// a reader never sees a partial file and an OK return survives a crash.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// Reads a whole file. NOT_FOUND / PERMISSION_DENIED / INTERNAL naming it.
absl::Status ReadFile(const std::string& path, std::string* contents);

// Prints "<program>: error: <message>" on one line to stderr.
void PrintError(absl::string_view program, absl::string_view message);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_FLAGS_UTIL_H_
