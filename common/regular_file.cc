#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pstrain {
namespace {

// read() is fed at most this many bytes at a time.
constexpr uint64_t kIoChunkBytes = uint64_t{1} << 30;

// What a non-regular file is, for the error message.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_bytes_(other.size_bytes_) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_bytes_ = other.size_bytes_;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status RegularFile::ReadAt(const std::string& path, uint64_t offset,
                                 char* out, uint64_t size) const {
  uint64_t got = 0;
  while (got < size) {
    const ssize_t n =
        ::pread(fd_, out + got, std::min(size - got, kIoChunkBytes),
                static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(path, ": read"));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": file ended at byte ", offset + got,
                       " while reading up to byte ", offset + size,
                       " (it shrank while being read)"));
    }
    got += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path,
                                            bool follow_symlinks) {
  const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY |
                    (follow_symlinks ? 0 : O_NOFOLLOW);
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP && !follow_symlinks) {
      return absl::InvalidArgumentError(
          absl::StrCat(path,
                       ": a symbolic link (not followed); expected a "
                       "regular file"));
    }
    return ErrnoToStatus(error, path);
  }
  RegularFile file(fd, 0);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", KindOf(st.st_mode), "; expected a regular file"));
  }
  // Regular files ignore O_NONBLOCK; cleared all the same, so that no read
  // of a file that turns out to be one (on an odd file system) is short.
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    return ErrnoToStatus(errno, path);
  }
  file.size_bytes_ = static_cast<uint64_t>(st.st_size);
  return file;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes,
                                          bool follow_symlinks) {
  ASSIGN_OR_RETURN(RegularFile file, OpenRegularFile(path, follow_symlinks));
  auto too_big = [&](absl::string_view size) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes; expected at most ", max_bytes));
  };
  if (file.size_bytes() > max_bytes) {
    return too_big(absl::StrCat(file.size_bytes()));
  }
  // Reads on past the size fstat() gave, up to one byte more than allowed,
  // to see a file that grew past the limit.
  std::string contents;
  contents.reserve(static_cast<size_t>(file.size_bytes()));
  char buffer[64 << 10];
  while (contents.size() <= max_bytes) {
    const ssize_t n = ::read(file.fd(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(path, ": read"));
    }
    if (n == 0) return contents;
    contents.append(buffer, static_cast<size_t>(n));
  }
  return absl::DataLossError(
      absl::StrCat(path, ": grew past ", max_bytes,
                   " bytes while read; expected at most ", max_bytes));
}

std::string EscapeForMessage(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "...");
}

}  // namespace pstrain
