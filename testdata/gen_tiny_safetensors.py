#!/usr/bin/env python3
"""Generates testdata/tiny.safetensors, the fixture of common/safetensors_test.

No independent safetensors writer can be installed here: Debian 12 has no
python3-safetensors, PyPI is out of reach, and Debian's PyTorch (1.13) has no
safetensors writer. So this script writes the bytes by hand, with only
`struct` and `json`, following the reference implementation's serializer
(huggingface/safetensors, safetensors/src/tensor.rs, `prepare`):
  - tensors sorted by descending dtype alignment (its Dtype enum order:
    ... I32 < U32 < F32 < C64 < F64 < I64 < U64), then by name;
  - data_offsets laid end to end from 0 in that order;
  - compact JSON (no spaces), "__metadata__" first, then each tensor as
    {"dtype","shape","data_offsets"} in that key order, non-ASCII text as
    raw UTF-8;
  - the header padded with spaces to a multiple of 8 bytes, its length as a
    little-endian uint64 before it.
The reference keeps "__metadata__" in a hash map (any key order); this
fixture sorts its keys, as our writer does. The test also checks our writer
against byte strings asserted by the reference's own tests.

Run from anywhere: python3 testdata/gen_tiny_safetensors.py
"""
import json
import os
import struct

# Values are exact in binary floating point, so the test can compare them
# with ==.
TENSORS = [
    # (name, dtype, shape, values)
    ("conv1.weight", "F32", [2, 1, 3, 3], [(i - 9) * 0.25 for i in range(18)]),
    ("conv1.bias", "F32", [2], [0.5, -1.5]),
    ("empty", "F32", [0, 4], []),
    ("unicode.\u00e9", "F32", [1], [2.0**100]),
    ("fc.scale", "F64", [3], [1.0 / 3.0, -2.5, 1e-300]),
    ("optimizer.step", "I64", [], [200]),
    ("data.position", "I64", [3], [1, -37, 12345678901]),
]
METADATA = {"format": "pt", "step": "200"}

PACK = {"F32": "<%df", "F64": "<%dd", "I64": "<%dq"}
# Position in the reference's Dtype enum (increasing alignment).
RANK = {"F32": 17, "F64": 19, "I64": 20}


def main():
    tensors = sorted(TENSORS, key=lambda t: (-RANK[t[1]], t[0]))
    header = {"__metadata__": dict(sorted(METADATA.items()))}
    data = b""
    for name, dtype, shape, values in tensors:
        count = 1
        for d in shape:
            count *= d
        assert count == len(values), name
        payload = struct.pack(PACK[dtype] % count, *values)
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(payload)],
        }
        data += payload
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False)
    text = text.encode("utf-8")
    text += b" " * (-len(text) % 8)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "tiny.safetensors")
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if __name__ == "__main__":
    main()
