// Helpers shared by the fuzz targets: reading typed values off the front of
// a fuzzer's input, and a private scratch folder for the readers that take
// a path.
//
// Thread-safety: a FuzzInput is thread-compatible; ScratchDir() is not
// thread-safe (libFuzzer runs one input at a time).
#ifndef PSTRAIN_FUZZ_FUZZ_UTIL_H_
#define PSTRAIN_FUZZ_FUZZ_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

// Aborts (a crash libFuzzer records) when an invariant does not hold.
#define FUZZ_CHECK(cond)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                  \
      std::abort();                                                         \
    }                                                                       \
  } while (0)

namespace pstrain {
namespace fuzz {

// Consumes fixed-size values from the front of the input; once it runs dry
// every value reads as zero.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T Take() {
    T value{};
    const size_t n = sizeof(T) < size_ ? sizeof(T) : size_;
    std::memcpy(&value, data_, n);
    data_ += n;
    size_ -= n;
    return value;
  }
  // An integer in [lo, hi] (hi >= lo), from one byte or more.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t raw = span <= 256 ? Take<uint8_t>() : Take<uint32_t>();
    return lo + static_cast<int64_t>(raw % span);
  }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // The rest of the input.
  absl::string_view Rest() {
    absl::string_view rest(reinterpret_cast<const char*>(data_), size_);
    data_ += size_;
    size_ = 0;
    return rest;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

// A folder of this process's own under /dev/shm (or TMPDIR when there is no
// /dev/shm), created on first use.
const std::string& ScratchDir();

// Writes `bytes` to `path`, replacing it; aborts on failure (the fuzzer's
// machine, not the code under test, is broken).
void WriteFileOrDie(const std::string& path, absl::string_view bytes);

}  // namespace fuzz
}  // namespace pstrain

#endif  // PSTRAIN_FUZZ_FUZZ_UTIL_H_
