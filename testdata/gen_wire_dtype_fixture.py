"""Generates testdata/wire_dtype_fixture.txt: fp32 values and PyTorch's
conversions of them to bfloat16 and float16 (PyTorch 1.13,
`tensor.to(torch.bfloat16)` and `tensor.to(torch.float16)`, both round to
nearest, ties to even), which common/wire_dtype.h must match bit for bit.

Run: /usr/bin/python3 testdata/gen_wire_dtype_fixture.py \
       > testdata/wire_dtype_fixture.txt

Values: hand-picked edges (zeros, ties at both formats' rounding points,
float16's largest, overflow, subnormals of both, infinities, a NaN) and
20000 random fp32 bit patterns of every exponent (seed 39).

Output lines: "FP32 BF16 FP16", each the value's bits in hex (8, 4 and 4
digits).
"""
import struct

import torch

edges = [
    0.0, -0.0, 1.0, -1.0, 0.1, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, 1e5,
    -1e5, 6.1e-5, 5.96e-8, 2.98e-8, 1e-8, 1e-30, 1e-40, 3.4e38,
    float("inf"), float("-inf"),
]
bits = [struct.unpack("<I", struct.pack("<f", v))[0] for v in edges]
# Ties: the low 16 bits exactly 0x8000 (bfloat16) with an even and an odd
# upper half; float16 ties: the 13 low mantissa bits exactly 0x1000.
bits += [0x3F808000, 0x3F818000, 0x3F801000, 0x3F803000, 0x477FF000]
bits.append(0x7FC00001)  # a NaN
generator = torch.Generator().manual_seed(39)
random = torch.randint(0, 2**32, (20000,), generator=generator,
                       dtype=torch.int64)
bits += [int(b) for b in random]

values = torch.tensor(
    [struct.unpack("<f", struct.pack("<I", b))[0] for b in bits],
    dtype=torch.float32)
bf16 = values.to(torch.bfloat16).view(torch.int16)
fp16 = values.to(torch.float16).view(torch.int16)
for b, h, f in zip(bits, bf16.tolist(), fp16.tolist()):
    print("%08x %04x %04x" % (b, h & 0xFFFF, f & 0xFFFF))
