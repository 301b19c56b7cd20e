#include "common/flags_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace pstrain {

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoToStatus(errno, tmp);
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), f);
  const bool flushed = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  const int close_result = std::fclose(f);
  if (written != contents.size() || !flushed || close_result != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return ErrnoToStatus(error, path);
  }
  // The rename itself is durable once the folder is synced.
  const size_t slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos
                                 ? "."
                                 : (slash == 0 ? "/" : path.substr(0, slash));
  const int dir = open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir < 0) return ErrnoToStatus(errno, folder);
  const int synced = fsync(dir);
  const int error = errno;
  close(dir);
  if (synced != 0) return ErrnoToStatus(error, folder);
  return absl::OkStatus();
}

absl::Status ReadFile(const std::string& path, std::string* contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoToStatus(errno, path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *contents = buffer.str();
  return absl::OkStatus();
}

void PrintError(absl::string_view program, absl::string_view message) {
  std::fprintf(stderr, "%s: error: %s\n", std::string(program).c_str(),
               std::string(message).c_str());
  std::fflush(stderr);
}

}  // namespace pstrain
