#!/usr/bin/python3
"""A pstrain model file evaluated in PyTorch: loads FILE (models/model_file.h:
safetensors with the model's name, input shape, classes and the input
standardisation in its metadata) into tools/torch/torch_models.py's module of
the same name with load_state_dict(strict=True), and prints the test accuracy
on an IDX dataset's test split (default: Debian's dataset-fashion-mnist), the
images standardised with the file's input_mean and input_stddev as pstrain
does. `pstrain eval --checkpoint=FILE` prints the same figure: the two agree
when the file loads into PyTorch as it trained.

  /usr/bin/python3 tools/torch/eval_model_file.py FILE \\
      [--data_dir=/usr/share/datasets/fashion-mnist]

Exit 0 after printing "test accuracy: A (N images)"; 2 with a one-line
message for a file or dataset that does not read.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def read_model_file(path):
    """(metadata, {name: float32 tensor}) of a pstrain model file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] != "F32":
            raise ValueError("%s: tensor %s is %s; expected F32" %
                             (path, name, entry["dtype"]))
        begin, end = entry["data_offsets"]
        tensors[name] = torch.from_numpy(
            np.frombuffer(data[begin:end], dtype="<f4").copy()
            .reshape(entry["shape"]))
    return meta, tensors


def read_idx(path):
    """An IDX file (gzip or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(
        shape)


def find(data_dir, stem):
    for name in (stem + "-ubyte.gz", stem + "-ubyte", stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("%s: no %s-ubyte[.gz]" % (data_dir, stem))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch", type=int, default=1000)
    a = p.parse_args()
    try:
        meta, tensors = read_model_file(a.file)
        chw = [int(x) for x in meta["input_chw"].split(",")]
        classes = int(meta["num_classes"])
        mean = float(meta.get("input_mean", 0.0))
        stddev = float(meta.get("input_stddev", 1.0))
        images = read_idx(find(a.data_dir, "t10k-images-idx3"))
        labels = read_idx(find(a.data_dir, "t10k-labels-idx1"))
    except (OSError, KeyError, ValueError) as e:
        print("eval_model_file: %s" % e, file=sys.stderr)
        return 2
    model = torch_models.build_any(meta["model"], chw[0], chw[1], classes)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    x = (images.astype(np.float32) * (1.0 / 255.0) - mean) / stddev
    x = torch.from_numpy(x.reshape(-1, *chw))
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), a.batch):
            logits = model(x[i:i + a.batch])
            correct += int((logits.argmax(1).numpy() ==
                            labels[i:i + a.batch]).sum())
    print("%s (%s, %s steps) in PyTorch %s: test accuracy: %.4f (%d images)" %
          (a.file, meta["model"], meta.get("steps", "?"), torch.__version__,
           correct / len(x), len(x)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
