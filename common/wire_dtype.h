// 16-bit wire formats for pushed gradients and pulled weights (issue 39):
// the shards keep fp32 weights and optimizer state and every worker
// computes in fp32; a chunk may cross the wire as bfloat16 or float16 to
// halve its bytes, converted at the edges (common/chunk_message.h).
//
//  - bfloat16: the upper 16 bits of the fp32 value, rounded to nearest,
//    ties to even, as PyTorch's `tensor.to(torch.bfloat16)` (c10's
//    round_to_nearest_even); a NaN stays a (quiet) NaN. fp32's exponent
//    range, 8 bits of precision: nothing to scale.
//  - float16 (IEEE 754 binary16, converted as PyTorch's c10::Half, which
//    rounds to nearest even as PyTorch's `to(torch.float16)`): 11 bits of
//    precision but a range of 6e-8 to 65504, so a chunk is scaled by a
//    power of two 2^e before rounding (ScaleExponent: its largest
//    magnitude lands in [16384, 32768)) and by 2^-e after; both scalings
//    are exact, so the value received is fp16's rounding of the value at
//    that scale. A value past fp16's range after scaling cannot occur (the
//    largest sits below 32768); a non-finite value is never sent (a worker
//    checks its gradients first, the shard never holds one).
//
// Thread-safety: stateless functions.
#ifndef PSTRAIN_COMMON_WIRE_DTYPE_H_
#define PSTRAIN_COMMON_WIRE_DTYPE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/ps.pb.h"

namespace pstrain {

// Bytes per element on the wire: 4 (DTYPE_FLOAT32), 2 (DTYPE_BFLOAT16,
// DTYPE_FLOAT16); 0 for any other value.
int WireBytesPerElement(int dtype);

// "fp32", "bf16", "fp16" (the job spec's and flags' spelling) to the
// dtype; INVALID_ARGUMENT naming `field` and the spellings otherwise.
absl::StatusOr<DType> ParseWireDtype(absl::string_view spelling,
                                     absl::string_view field = "wire_dtype");
// The spelling of a wire dtype ("fp32" for anything else).
const char* WireDtypeSpelling(DType dtype);

uint16_t FloatToBfloat16(float value);
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float value);
float Float16ToFloat(uint16_t bits);

// The float16 scale exponent e of `values` (see the top of this file): 0
// for an empty or all-zero chunk.
int ScaleExponent(absl::Span<const float> values);

// Converts `values` into `out` (same size) in `dtype` (BFLOAT16 or
// FLOAT16; FLOAT16 scaled by 2^scale_exponent first).
void EncodeHalves(absl::Span<const float> values, DType dtype,
                  int scale_exponent, uint16_t* out);
// Values converted to a 16-bit wire dtype once, for every receiver that
// gets them so (a shard's pull replies to several workers,
// server/shared_floats.h): `bits` in `dtype`, scaled by 2^scale_exponent
// (FLOAT16's ScaleExponent of the values; 0 for BFLOAT16).
struct EncodedHalves {
  DType dtype = DTYPE_BFLOAT16;
  int scale_exponent = 0;
  // `size` values, allocated without the zero-filling pass a
  // std::vector's resize would add before the conversion writes them.
  std::unique_ptr<uint16_t[]> data;
  size_t size = 0;
  absl::Span<const uint16_t> bits() const { return {data.get(), size}; }
};
// `values` in `dtype` (BFLOAT16 or FLOAT16), as EncodeHalves with the
// exponent ScaleExponent chooses.
EncodedHalves EncodeHalvesOf(absl::Span<const float> values, DType dtype);

// The reverse: `halves` in `dtype` into `out`, times 2^-scale_exponent.
void DecodeHalves(const uint16_t* halves, DType dtype, int scale_exponent,
                  absl::Span<float> out);

// What a receiver gets for `values` sent as `dtype` (FLOAT32: the values
// themselves), in place: the fp32 job "whose gradients and weights were
// rounded the same way" that a 16-bit job must equal bit for bit.
void RoundThroughWire(DType dtype, absl::Span<float> values);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_WIRE_DTYPE_H_
