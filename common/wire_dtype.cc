#include "common/wire_dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

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

namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

// IEEE binary16 conversions in fp32 arithmetic, round to nearest even, the
// formulas of Marat Dukhan's FP16 library (fp16_ieee_from_fp32_value,
// fp16_ieee_to_fp32_value), which PyTorch's c10::Half uses: no compiler
// _Float16 (clang 14 has none on x86-64) and no F16C needed.
uint16_t FloatToFloat16(float value) {
  // Scaling by 2^112 then 2^-110 rounds the magnitude once, at fp16's
  // precision, whatever its exponent (an overflow becomes infinity).
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(value) * scale_to_inf) * scale_to_zero;
  const uint32_t w = BitsOf(value);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FloatOf((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = BitsOf(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t w = static_cast<uint32_t>(bits) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal values: the exponent re-biased by a multiply by 2^-112.
  const uint32_t exp_offset = 0xE0u << 23;
  const float normalized = FloatOf((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  // Subnormal values: the mantissa as the low bits of 0.5's, minus 0.5.
  const float denormalized = FloatOf((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t denormalized_cutoff = 1u << 27;
  return FloatOf(sign | (two_w < denormalized_cutoff ? BitsOf(denormalized)
                                                     : BitsOf(normalized)));
}

namespace {

// The bulk conversions run 8 or 16 values at a time with AVX2 and F16C
// where the CPU has them (checked once; every x86-64 CPU since 2013 does),
// and one value at a time otherwise; both give the same bits (F16C's
// VCVTPS2PH rounds to nearest even as FloatToFloat16 does; multiplying by
// a power of two that is a normal float is ldexp's correctly rounded
// result). F16C is CPUID leaf 1's ECX bit 29 (clang 14's
// __builtin_cpu_supports does not know it).
bool HasAvx2F16c() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c =
        __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return has;
#else
  return false;
#endif
}

// 2^e as a float where that is a normal number, else 0 (callers then
// scale with ldexp).
float PowerOfTwo(int e) {
  return e >= -126 && e <= 127 ? std::ldexp(1.0f, e) : 0.0f;
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) __m256i RoundToBfloat16x8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
      16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

__attribute__((target("avx2,f16c"))) size_t EncodeBfloat16Avx2(const float* in,
                                                               size_t n,
                                                               uint16_t* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i low = RoundToBfloat16x8(_mm256_loadu_ps(in + i));
    const __m256i high = RoundToBfloat16x8(_mm256_loadu_ps(in + i + 8));
    // packus works within 128-bit lanes: restore the order after it.
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(low, high), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t DecodeBfloat16Avx2(
    const uint16_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t EncodeFloat16Avx2(const float* in,
                                                              size_t n,
                                                              float scale,
                                                              uint16_t* out) {
  const __m256 factor = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i halves =
        _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(in + i), factor),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), halves);
  }
  return i;
}

__attribute__((target("avx2,f16c"))) size_t DecodeFloat16Avx2(
    const uint16_t* in, size_t n, float scale, float* out) {
  const __m256 factor = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 wide = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(wide, factor));
  }
  return i;
}

// The largest |v| of in[0, n) (NaNs ignored, as std::max does) over the
// whole multiples of 8; the caller takes the rest.
__attribute__((target("avx2,f16c"))) float LargestMagnitudeAvx2(const float* in,
                                                                size_t n,
                                                                size_t* done) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 largest = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // maxps returns its second operand when either is a NaN.
    largest = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(in + i), magnitude),
                            largest);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  *done = i;
  return *std::max_element(lanes, lanes + 8);
}

#else  // no AVX2 outside x86-64: the scalar loops do everything.
size_t EncodeBfloat16Avx2(const float*, size_t, uint16_t*) { return 0; }
size_t DecodeBfloat16Avx2(const uint16_t*, size_t, float*) { return 0; }
size_t EncodeFloat16Avx2(const float*, size_t, float, uint16_t*) { return 0; }
size_t DecodeFloat16Avx2(const uint16_t*, size_t, float, float*) { return 0; }
float LargestMagnitudeAvx2(const float*, size_t, size_t* done) {
  *done = 0;
  return 0;
}
#endif

}  // namespace

int ScaleExponent(absl::Span<const float> values) {
  float largest = 0;
  size_t i = 0;
  if (HasAvx2F16c()) {
    largest = LargestMagnitudeAvx2(values.data(), values.size(), &i);
  }
  for (; i < values.size(); ++i) {
    largest = std::max(largest, std::fabs(values[i]));
  }
  if (!(largest > 0) || !std::isfinite(largest)) return 0;
  // largest = m * 2^k with m in [0.5, 1): times 2^(15 - k) it is in
  // [2^14, 2^15).
  int k = 0;
  std::frexp(largest, &k);
  return 15 - k;
}

void EncodeHalves(absl::Span<const float> values, DType dtype,
                  int scale_exponent, uint16_t* out) {
  const size_t n = values.size();
  const bool simd = HasAvx2F16c();
  if (dtype == DTYPE_BFLOAT16) {
    size_t i = simd ? EncodeBfloat16Avx2(values.data(), n, out) : 0;
    for (; i < n; ++i) out[i] = FloatToBfloat16(values[i]);
    return;
  }
  // Powers of two scale exactly (as long as the result stays a normal
  // fp32 number, which the exponent's choice keeps for the values that
  // matter: the largest lands near 2^15).
  const float scale = PowerOfTwo(scale_exponent);
  size_t i =
      simd && scale != 0 ? EncodeFloat16Avx2(values.data(), n, scale, out) : 0;
  for (; i < n; ++i) {
    out[i] = FloatToFloat16(scale != 0 ? values[i] * scale
                                       : std::ldexp(values[i], scale_exponent));
  }
}

EncodedHalves EncodeHalvesOf(absl::Span<const float> values, DType dtype) {
  EncodedHalves out;
  out.dtype = dtype;
  out.scale_exponent = dtype == DTYPE_FLOAT16 ? ScaleExponent(values) : 0;
  out.size = values.size();
  out.data.reset(new uint16_t[out.size]);  // default-initialised: no fill
  EncodeHalves(values, dtype, out.scale_exponent, out.data.get());
  return out;
}

void DecodeHalves(const uint16_t* halves, DType dtype, int scale_exponent,
                  absl::Span<float> out) {
  const size_t n = out.size();
  const bool simd = HasAvx2F16c();
  if (dtype == DTYPE_BFLOAT16) {
    size_t i = simd ? DecodeBfloat16Avx2(halves, n, out.data()) : 0;
    for (; i < n; ++i) out[i] = Bfloat16ToFloat(halves[i]);
    return;
  }
  const float scale = PowerOfTwo(-scale_exponent);
  size_t i =
      simd && scale != 0 ? DecodeFloat16Avx2(halves, n, scale, out.data()) : 0;
  for (; i < n; ++i) {
    out[i] = scale != 0
                 ? Float16ToFloat(halves[i]) * scale
                 : std::ldexp(Float16ToFloat(halves[i]), -scale_exponent);
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
