#!/usr/bin/env python3
"""PyTorch baseline of train_bench: times forward + backward + Adam step of a
zoo model (tools/torch/torch_models.py) on a fixed random batch and prints one
line: "samples_per_sec=<float> params=<int> loss=<float> memory_mib=<float|->
precision=<str> device=<str>".

--precision is train_bench's (README "Mixed precision"): fp32 forbids TF32;
tf32 allows TF32 tensor cores in cuDNN convolutions and in matmuls
(torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32), as
pstrain's CUDA backend does (CUDNN_TENSOR_OP_MATH, CUBLAS_TF32_TENSOR_OP_MATH);
bf16 and fp16 run the forward and the loss under torch.autocast(dtype=...)
with fp32 weights and Adam (fp16 with torch.cuda.amp.GradScaler). The older
--tf32 0|1 is fp32|tf32. memory_mib is the GPU memory in use (total - free,
torch.cuda.mem_get_info) after the timed steps, read once outside the timing,
above what was in use before the model was made (PyTorch's caching allocator
keeps what it reserved): train_bench measures its own the same way. On the
CPU it is the peak resident set (VmHWM, reset through /proc/self/clear_refs
before the model is made) above the resident set then, as train_bench's.

The BERTs (--seq_len S; --num_classes is the vocabulary) train on random
ids [batch, S] with [CLS] first and BERT's MLM loss: cross-entropy over
round(0.15 * (S - 1)) labelled positions per sequence, as pstrain's
synthetic_tokens batches (worker/token_dataset.h). The MLM head runs at
the labelled positions only (Bert.forward's positions, BERT's
gather_indexes), as pstrain's does; --bert_head=all runs it at every
position with ignore_index -100 elsewhere (HuggingFace's
BertForMaskedLM).

Run by `train_bench --compare_pytorch`; also usable by hand:
  python3 tools/torch/torch_bench.py --model resnet18 --channels 1 --image_size 28 \\
      --num_classes 10 --batch_size 64 --steps 20 --device cpu --threads 2
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import build_any  # noqa: E402


def proc_status_bytes(field):
    """A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss():
    """Resets VmHWM to the current resident set; returns that, or None."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return proc_status_bytes("VmRSS")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--channels", type=int, default=0)
    p.add_argument("--image_size", type=int, default=0)
    p.add_argument("--seq_len", type=int, default=0,
                   help="the BERTs: tokens per sequence")
    p.add_argument("--bert_head", choices=("predicted", "all"),
                   default="predicted")
    p.add_argument("--num_classes", type=int, required=True)
    p.add_argument("--batch_size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"),
                   default=None)
    p.add_argument("--tf32", type=int, choices=(0, 1), default=0)
    a = p.parse_args()
    if a.precision is None:
        a.precision = "tf32" if a.tf32 else "fp32"
    tf32 = a.precision != "fp32"  # autocast's fp32 ops as PyTorch's default
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    baseline = None
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.cuda.init()
        torch.zeros(1, device=device)  # the CUDA context, before the baseline
        free, total = torch.cuda.mem_get_info(device)
        baseline = total - free
    rss_baseline = None
    if device.type == "cpu":
        rss_baseline = reset_peak_rss()
    torch.manual_seed(1)
    model = build_any(a.model, a.channels, a.image_size, a.num_classes).to(device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    if a.seq_len > 0:
        # [CLS] (id 2, text/special_ids.h) then ordinary ids (kFirstPieceId 5
        # on); 15% of the rest labelled, -100 elsewhere.
        x = torch.randint(5, a.num_classes, (a.batch_size, a.seq_len),
                          device=device)
        x[:, 0] = 2
        y = torch.full((a.batch_size, a.seq_len), -100, device=device)
        predicted = max(1, round(0.15 * (a.seq_len - 1)))
        for row in range(a.batch_size):
            at = torch.randperm(a.seq_len - 1)[:predicted] + 1
            y[row, at] = x[row, at]
            x[row, at] = 4  # [MASK]
        if a.bert_head == "predicted":
            positions = (y.reshape(-1) != -100).nonzero().squeeze(1)
            y = y.reshape(-1)[positions]
    else:
        x = torch.randn(a.batch_size, a.channels, a.image_size, a.image_size,
                        device=device)
        y = torch.randint(0, a.num_classes, (a.batch_size,), device=device)

    scaler = torch.cuda.amp.GradScaler(enabled=a.precision == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast,
                            enabled=autocast is not None):
            logits = (model(x, positions=positions)
                      if a.seq_len > 0 and a.bert_head == "predicted"
                      else model(x))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   y.reshape(-1), ignore_index=-100)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    loss = None
    for _ in range(a.warmup):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    params = sum(t.numel() for t in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    memory = "-"
    if baseline is not None:
        free, total = torch.cuda.mem_get_info(device)
        memory = f"{(total - free - baseline) / 1048576:.0f}"
    elif rss_baseline is not None:
        peak = proc_status_bytes("VmHWM")
        if peak is not None:
            memory = f"{(peak - rss_baseline) / 1048576:.0f}_(peak_RSS)"
    print(f"samples_per_sec={a.batch_size * a.steps / seconds:.3f} params={params} "
          f"loss={loss.item():.4f} memory_mib={memory} precision={a.precision} "
          f"device={name.replace(' ', '_')}")


if __name__ == "__main__":
    main()
