#include "common/nonfinite.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pstrain {

int64_t FindNonFinite(absl::Span<const float> values) {
  // A float is NaN or infinite iff its 8 exponent bits are all ones. Blocks
  // of 4096 values are scanned without an early exit (a loop the compiler
  // vectorises); the first block with a hit is searched again element by
  // element.
  // The loops index a raw pointer: Span's operator[] asserts its bound
  // in a build without NDEBUG (Bazel's default), and that branch kept
  // GCC from vectorising the scan (one element at a time, ~12 ms per 100
  // MB on the machines in BENCHMARKS.md).
  constexpr size_t kBlock = 4096;
  const float* const v = values.data();
  const size_t n = values.size();
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = begin + kBlock < n ? begin + kBlock : n;
    uint32_t any = 0;
    for (size_t i = begin; i < end; ++i) any |= NonFiniteBit(v[i]);
    if (any == 0) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(v[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

int64_t ScaleFindingNonFinite(absl::Span<float> values, float scale) {
  // A block at a time, scanned while it is still in the cache.
  constexpr size_t kBlock = 4096;
  int64_t first = -1;
  for (size_t begin = 0; begin < values.size(); begin += kBlock) {
    const absl::Span<float> block = values.subspan(begin, kBlock);
    float* const v = block.data();  // a raw pointer: see FindNonFinite()
    for (size_t i = 0; i < block.size(); ++i) v[i] *= scale;
    if (first >= 0) continue;
    if (const int64_t bad = FindNonFinite(block); bad >= 0) {
      first = static_cast<int64_t>(begin) + bad;
    }
  }
  return first;
}

std::string NonFiniteText(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return absl::StrCat(value);
}

}  // namespace pstrain
