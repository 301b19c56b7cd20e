// A main() for fuzz targets built without libFuzzer (gcc, --config=asan):
// runs LLVMFuzzerTestOneInput once on each file named on the command line,
// and on every file in each folder named. Exits 1 when no input was found,
// so that a corpus test cannot pass on an empty or misplaced corpus.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv)
    __attribute__((weak));

namespace {

bool RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read\n", path.c_str());
    return false;
  }
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string data = bytes.str();
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()),
                         data.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    std::error_code error;
    if (std::filesystem::is_directory(argv[i], error)) {
      std::vector<std::string> files;
      for (const auto& e :
           std::filesystem::recursive_directory_iterator(argv[i], error)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
      for (const std::string& f : files) runs += RunFile(f) ? 1 : 0;
    } else {
      runs += RunFile(argv[i]) ? 1 : 0;
    }
  }
  std::printf("ran %d inputs\n", runs);
  return runs > 0 ? 0 : 1;
}
