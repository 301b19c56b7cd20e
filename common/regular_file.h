// Reading files whose contents and type come from outside the process
// (checkpoints, model files, manifests): a file in their place may have been
// replaced by a symbolic link, a FIFO or a device such as /dev/zero.
//
// OpenRegularFile opens read-only with O_NONBLOCK (so that opening a FIFO
// does not wait for a writer; the flag is cleared again once the file is
// known to be regular), O_CLOEXEC and, unless follow_symlinks, O_NOFOLLOW
// (a symbolic link as the last component is refused; folders on the way
// are followed). It then fstat()s the open file and refuses anything but a
// regular file, so every later read is bounded by the size it reports (a
// reader must still expect the file to shrink or grow: see ReadSmallFile).
//
// Errors name the file and what was found, on one line:
//   - NOT_FOUND: no such file;
//   - INVALID_ARGUMENT: a symbolic link (not followed), a FIFO, a device, a
//     socket or a folder where a regular file was expected;
//   - DATA_LOSS: a file larger than the caller's limit (ReadSmallFile);
//   - PERMISSION_DENIED / INTERNAL: other errno values.
//
// EscapeForMessage makes text taken from a file safe to print in a one-line
// error message: C escapes for control bytes, quotes and backslashes
// (absl::CHexEscape), cut to a length.
//
// Thread-safety: plain functions; a RegularFile is thread-compatible.
#ifndef PSTRAIN_COMMON_REGULAR_FILE_H_
#define PSTRAIN_COMMON_REGULAR_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pstrain {

// An open regular file; closes it on destruction. Move-only.
class RegularFile {
 public:
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  // Its size in bytes when it was opened.
  uint64_t size_bytes() const { return size_bytes_; }

  // Reads exactly `size` bytes from byte `offset` into `out` (pread: the
  // file offset is unchanged); DATA_LOSS naming `path` if the file ends
  // sooner (it shrank).
  absl::Status ReadAt(const std::string& path, uint64_t offset, char* out,
                      uint64_t size) const;

 private:
  friend absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path,
                                                     bool follow_symlinks);
  RegularFile(int fd, uint64_t size_bytes) : fd_(fd), size_bytes_(size_bytes) {}

  int fd_ = -1;
  uint64_t size_bytes_ = 0;
};

// Opens `path` for reading as above.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path,
                                            bool follow_symlinks = false);

// The whole of the regular file `path` (opened as OpenRegularFile does), or
// DATA_LOSS if it is, or grows while read to, more than `max_bytes`: no more
// than max_bytes + 1 bytes are ever read or allocated.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes,
                                          bool follow_symlinks = false);

// `text` with control bytes, quotes and backslashes C-escaped, its first
// `max_bytes` bytes only ("..." after a cut).
std::string EscapeForMessage(absl::string_view text, size_t max_bytes = 80);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_REGULAR_FILE_H_
