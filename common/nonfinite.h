// Non-finite values (NaN, +inf, -inf) in gradients: finding them fast, and
// how a worker and a shard report one (proto/ps.proto NonFinite,
// SkippedStep). A step whose loss or gradients hold one is skipped on
// every shard (server/parameter_shard.h), as PyTorch's mixed-precision
// GradScaler skips optimizer.step() for a non-finite gradient, but for
// every run.
//
// Thread-safety: pure functions and plain structs.
#ifndef PSTRAIN_COMMON_NONFINITE_H_
#define PSTRAIN_COMMON_NONFINITE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/types/span.h"

namespace pstrain {

// Where a worker found the first non-finite value of a step.
struct NonFiniteValue {
  // The parameter tensor (model order); -1: the loss.
  int32_t param_id = -1;
  // The element within the tensor (0 for the loss).
  int64_t element = 0;
  // NonFiniteText() of the value: "nan", "inf" or "-inf".
  std::string value;
};

// A sync step skipped for a non-finite value: the lowest worker id that
// reported one, and where.
struct SkippedStepInfo {
  int64_t step = -1;
  int worker_id = -1;
  NonFiniteValue nonfinite;
};

// 1 if `value` is NaN or infinite (its 8 exponent bits all ones), else 0.
// Branch-free, so that a loop can OR it over its elements and still be
// vectorised (FindNonFinite(); the shard's optimizer loops check the
// weights they write this way, with no extra pass).
inline uint32_t NonFiniteBit(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return (bits & 0x7f800000u) == 0x7f800000u;
}

// The index of the first NaN or infinity in `values`, or -1 if every value
// is finite. One pass over the exponent bits (vectorised; about memory
// bandwidth: ~10 GB/s on one core of the machines in BENCHMARKS.md).
int64_t FindNonFinite(absl::Span<const float> values);

// Multiplies every value by `scale` (0 < scale <= 1: an average's 1 / W)
// and returns what FindNonFinite() of the products would: a product is
// NaN or infinite exactly where its value was, so this is the scan of a
// sum and its division in one pass.
int64_t ScaleFindingNonFinite(absl::Span<float> values, float scale);

// "nan", "inf", "-inf"; for a finite value, its shortest decimal form.
std::string NonFiniteText(float value);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_NONFINITE_H_
