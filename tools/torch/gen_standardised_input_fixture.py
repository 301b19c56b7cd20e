#!/usr/bin/env python3
"""Generates the fixture behind models/model_file_test's
StandardisedInputGivesPyTorchsLogits (Debian's python3-torch 1.13; no torch at
test time).

pstrain trains on standardised pixels, (pixel / 255 - mean) / stddev with the
training set's per-channel statistics (worker/dataset.cc), so a model file's
weights compute the trained function only of standardised input; the file
says so in its "input_mean" and "input_stddev" metadata (models/model_file.h).
Fed pixel / 255 instead, a LeNet-5 pstrain trained for one epoch on
Fashion-MNIST scores 0.68 in PyTorch instead of its 0.8447.

  testdata/lenet5_standardised.safetensors
      tools/torch/torch_models.py's LeNet-5 (1x28x28, 10 classes) with the
      weights of --weights=FILE (the committed one: `pstrain run --epochs=1
      --checkpoint_dir=/tmp/plainrun`'s model.safetensors, test accuracy
      0.8447; without the flag, torch.manual_seed(41)'s initial weights,
      whose logits barely depend on the input) and pstrain's model-file
      metadata, input_mean and
      input_stddev those of the Fashion-MNIST training set in [0, 1] (mean of
      all pixels, population standard deviation, as worker/dataset.cc)
  testdata/lenet5_standardised_fixture.txt
      line 1: input_mean input_stddev (as written in the file)
      then per image: "image <label>", 784 raw bytes (the first 3 test
      images), "logits" and PyTorch's 10 eval-mode logits of
      (byte / 255 - mean) / stddev

  /usr/bin/python3 tools/torch/gen_standardised_input_fixture.py
      [--data=/usr/share/datasets/fashion-mnist] [--weights=FILE]
      (from the repository root)
"""
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tools", "torch"))
from torch_models import build_any  # noqa: E402


def read_idx(path):
    with gzip.open(path) as f:
        raw = f.read()
    dims = np.frombuffer(raw, ">u4", raw[3], 4)
    return np.frombuffer(raw, "u1", offset=4 + 4 * raw[3]).reshape(dims)


def write_safetensors(path, state, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in state.items():
        data = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    data, weights = "/usr/share/datasets/fashion-mnist", None
    for arg in sys.argv[1:]:
        if arg.startswith("--data="):
            data = arg[len("--data="):]
        elif arg.startswith("--weights="):
            weights = arg[len("--weights="):]
        else:
            sys.exit("unknown argument %s; expected --data= or --weights=" % arg)
    train = read_idx(os.path.join(data, "train-images-idx3-ubyte.gz"))
    test = read_idx(os.path.join(data, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data, "t10k-labels-idx1-ubyte.gz"))
    x = train.astype(np.float64) / 255
    mean_text, std_text = "%.9g" % x.mean(), "%.9g" % x.std()
    mean, std = float(mean_text), float(std_text)

    torch.manual_seed(41)
    model = build_any("lenet5", 1, 28, 10).eval()
    if weights:
        from bert_compare import read_model_file
        model.load_state_dict(read_model_file(weights), strict=True)
    write_safetensors(
        os.path.join(root, "testdata", "lenet5_standardised.safetensors"),
        model.state_dict(),
        {"format": "pstrain.model/1", "model": "lenet5",
         "input_chw": "1,28,28", "num_classes": "10", "steps": "0",
         "dataset": "fashion_mnist", "input_mean": mean_text,
         "input_stddev": std_text})
    images = test[:3]
    inp = torch.from_numpy(
        ((images.astype(np.float32) / 255 - np.float32(mean)) /
         np.float32(std))[:, None].astype(np.float32))
    with torch.no_grad():
        logits = model(inp).numpy()
    lines = ["%s %s" % (mean_text, std_text)]
    for img, label, row in zip(images, labels[:3], logits):
        lines.append("image %d" % label)
        lines.append(" ".join(str(int(b)) for b in img.reshape(-1)))
        lines.append("logits " + " ".join("%.9g" % v for v in row))
    with open(os.path.join(root, "testdata",
                           "lenet5_standardised_fixture.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
