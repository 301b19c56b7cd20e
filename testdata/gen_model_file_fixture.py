#!/usr/bin/env python3
"""Generates the model-file fixtures with PyTorch (Debian's python3-torch
1.13), so that models/model_file_test checks, without torch at test time,
that pstrain's model.safetensors is PyTorch's state_dict:

  lenet5_torch.safetensors  the state_dict of tools/torch/torch_models.py's LeNet-5
                            (1x28x28 input, 10 classes, torch.manual_seed(3)),
                            written as safetensors (the format's reference
                            layout: 8-byte little-endian header length, JSON
                            header, raw little-endian bytes)
  lenet5_torch_logits.txt   that model's eval-mode logits (20 floats, one per
                            line) for the input x[i] = sin(0.37 * i + 0.1),
                            shape [2, 1, 28, 28], flattened in NCHW order
  resnet18_torch_keys.txt   "name dtype shape" of every state_dict entry of
                            ResNet-18 at 1x28x28, 10 classes, in order

  /usr/bin/python3 testdata/gen_model_file_fixture.py   (from the repository root)
"""
import json
import math
import os
import struct
import sys

import torch

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "tools", "torch"))
from torch_models import build_any  # noqa: E402

DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, state):
    header, blobs, offset = {}, [], 0
    for name, t in state.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    out = os.path.join(root, "testdata")
    torch.manual_seed(3)
    lenet = build_any("lenet5", 1, 28, 10).eval()
    write_safetensors(os.path.join(out, "lenet5_torch.safetensors"),
                      lenet.state_dict())
    n = 2 * 1 * 28 * 28
    x = torch.tensor([math.sin(0.37 * i + 0.1) for i in range(n)],
                     dtype=torch.float32).reshape(2, 1, 28, 28)
    with torch.no_grad():
        logits = lenet(x).flatten().tolist()
    with open(os.path.join(out, "lenet5_torch_logits.txt"), "w") as f:
        f.write("".join("%.9g\n" % v for v in logits))
    resnet = build_any("resnet18", 1, 28, 10)
    with open(os.path.join(out, "resnet18_torch_keys.txt"), "w") as f:
        for name, t in resnet.state_dict().items():
            f.write("%s %s %s\n" % (name, DTYPES[t.dtype],
                                    ",".join(str(d) for d in t.shape)))


if __name__ == "__main__":
    main()
