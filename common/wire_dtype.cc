#include "common/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace pstrain {

int WireBytesPerElement(int dtype) {
  switch (dtype) {
    case DTYPE_FLOAT32:
      return 4;
    case DTYPE_BFLOAT16:
    case DTYPE_FLOAT16:
      return 2;
    default:
      return 0;
  }
}

absl::StatusOr<DType> ParseWireDtype(absl::string_view spelling,
                                     absl::string_view field) {
  if (spelling == "fp32") return DTYPE_FLOAT32;
  if (spelling == "bf16") return DTYPE_BFLOAT16;
  if (spelling == "fp16") return DTYPE_FLOAT16;
  // The caller's text, escaped and cut to 64 bytes.
  constexpr size_t kMaxEcho = 64;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": \"", absl::CHexEscape(spelling.substr(0, kMaxEcho)),
      spelling.size() > kMaxEcho ? "...\"" : "\"",
      "; expected fp32, bf16 or fp16"));
}

const char* WireDtypeSpelling(DType dtype) {
  switch (dtype) {
    case DTYPE_BFLOAT16:
      return "bf16";
    case DTYPE_FLOAT16:
      return "fp16";
    default:
      return "fp32";
  }
}

uint16_t FloatToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return 0x7FC0;  // a quiet NaN, as c10 gives
  // Round to nearest, ties to even (c10::detail::round_to_nearest_even).
  const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float Bfloat16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

uint16_t FloatToFloat16(float value) {
  const _Float16 half = static_cast<_Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

float Float16ToFloat(uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, sizeof(half));
  return static_cast<float>(half);
}

int ScaleExponent(absl::Span<const float> values) {
  float largest = 0;
  for (float v : values) largest = std::max(largest, std::fabs(v));
  if (!(largest > 0) || !std::isfinite(largest)) return 0;
  // largest = m * 2^k with m in [0.5, 1): times 2^(15 - k) it is in
  // [2^14, 2^15).
  int k = 0;
  std::frexp(largest, &k);
  return 15 - k;
}

void EncodeHalves(absl::Span<const float> values, DType dtype,
                  int scale_exponent, uint16_t* out) {
  if (dtype == DTYPE_BFLOAT16) {
    for (size_t i = 0; i < values.size(); ++i) {
      out[i] = FloatToBfloat16(values[i]);
    }
    return;
  }
  // Powers of two scale exactly (as long as the result stays a normal
  // fp32 number, which the exponent's choice keeps for the values that
  // matter: the largest lands near 2^15).
  for (size_t i = 0; i < values.size(); ++i) {
    out[i] = FloatToFloat16(std::ldexp(values[i], scale_exponent));
  }
}

void DecodeHalves(const uint16_t* halves, DType dtype, int scale_exponent,
                  absl::Span<float> out) {
  if (dtype == DTYPE_BFLOAT16) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = Bfloat16ToFloat(halves[i]);
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::ldexp(Float16ToFloat(halves[i]), -scale_exponent);
  }
}

void RoundThroughWire(DType dtype, absl::Span<float> values) {
  if (WireBytesPerElement(dtype) != 2) return;
  const int e = dtype == DTYPE_FLOAT16 ? ScaleExponent(values) : 0;
  std::vector<uint16_t> halves(values.size());
  EncodeHalves(values, dtype, e, halves.data());
  DecodeHalves(halves.data(), dtype, e, values);
}

}  // namespace pstrain
