#!/usr/bin/env python3
"""PyTorch reference for `pstrain run`: trains a zoo model
(tools/torch/torch_models.py, the same architecture) on Fashion-MNIST in one
process the way pstrain's sync mode does: Adam (lr 1e-3, betas 0.9/0.999,
eps 1e-8), global batch 128, inputs standardised with the training set's
mean and std, one epoch; then evaluates on the 10,000 test images.

  /usr/bin/python3 tools/torch/torch_reference_train.py --model resnet18 \\
      --epochs 1 --batch_size 128 --threads 2

With --optimizer=sgd (torch.optim.SGD: --momentum, --nesterov,
--weight_decay) and --warmup_steps/--lr_schedule/--lr_min/--total_steps,
the learning rate follows pstrain's ScheduledLr (optim/optimizer.h) per
optimizer step: linear warmup from 0, then cosine (CosineAnnealingLR's
closed form, held at --lr_min past its horizon) or constant, through a
LambdaLR (torch's LinearLR cannot start from 0).

Prints "accuracy=<float> train_seconds=<float> samples_per_sec=<float>".
"""
import math
import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import build_any  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet18")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--warmup_steps", type=int, default=0)
    p.add_argument("--lr_schedule", default="constant",
                   choices=["constant", "cosine"])
    p.add_argument("--lr_min", type=float, default=0.0)
    p.add_argument("--total_steps", type=int, default=0,
                   help="cosine horizon incl. warmup (0: epochs x steps)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data_dir
    xtr = read_idx(f"{d}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    ytr = read_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int64)
    xte = read_idx(f"{d}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    yte = read_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
    mean, std = xtr.mean(), xtr.std()
    xtr = torch.from_numpy((xtr - mean) / std).unsqueeze(1)
    xte = torch.from_numpy((xte - mean) / std).unsqueeze(1)
    ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)
    model = build_any(a.model, 1, 28, 10)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                              nesterov=a.nesterov, weight_decay=a.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    steps = len(xtr) // a.batch_size
    total = a.total_steps or steps * a.epochs
    warm = a.warmup_steps

    def factor(t):  # lr(t) / lr, as optim/optimizer.h's ScheduledLr
        if t < warm:
            return t / warm
        if a.lr_schedule == "cosine":
            t_max = max(1, total - warm)
            tp = min(t - warm, t_max)
            lr = a.lr_min + (a.lr - a.lr_min) * (1 + math.cos(math.pi * tp / t_max)) / 2
            return lr / a.lr
        return 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    start = time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(len(xtr))
        for i in range(steps):
            idx = order[i * a.batch_size:(i + 1) * a.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
            if (i + 1) % 50 == 0:
                rate = (i + 1) * a.batch_size / (time.perf_counter() - start)
                print(f"step {i + 1}/{steps} loss {loss.item():.4f} {rate:.1f} samples/sec",
                      flush=True)
    seconds = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(xte), 500):
            correct += (model(xte[i:i + 500]).argmax(1) == yte[i:i + 500]).sum().item()
    print(f"accuracy={correct / len(xte):.4f} train_seconds={seconds:.1f} "
          f"samples_per_sec={steps * a.batch_size * a.epochs / seconds:.1f}")


if __name__ == "__main__":
    main()
