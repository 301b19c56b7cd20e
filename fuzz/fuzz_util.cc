#include "fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace pstrain {
namespace fuzz {

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::error_code error;
    std::string base = "/dev/shm";
    if (!std::filesystem::is_directory(base, error)) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr ? tmp : "/tmp";
    }
    auto* path = new std::string(base + "/pstrain_fuzz_" +
                                 std::to_string(static_cast<long>(getpid())));
    std::filesystem::create_directories(*path, error);
    if (error) {
      std::fprintf(stderr, "cannot create %s\n", path->c_str());
      std::abort();
    }
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(ScratchDir(), e);
    });
    return path;
  }();
  return *dir;
}

void WriteFileOrDie(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace fuzz
}  // namespace pstrain
