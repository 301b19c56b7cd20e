#!/usr/bin/python3
"""How far a transformer drifts from fp32 when its projections round their
operands to bf16 or fp16: the figures behind models/precision_checks.h's
bounds. Run with Debian's python3-torch (/usr/bin/python3):

  /usr/bin/python3 tools/torch/sixteen_bit_bounds.py [--seeds=20]

pstrain's 16-bit precision (README "Mixed precision") rounds a linear
layer's input, weights and output gradient to the 16-bit type and
multiplies in fp32 (a product of two bf16 or fp16 values is exact in fp32,
so only the operands round); outputs and gradients stay fp32. This script
does the same in PyTorch with an autograd function in place of
torch.nn.functional.linear, then prints the largest relative L2 distance
from fp32 over the seeds:

1. precision_checks.h's ExpectProjectionsRound cases: the attention (hidden
   16, 2 heads) and the encoder block (hidden 16, 2 heads, feed-forward
   32), dropout 0, every parameter U(-1, 1), input [2, 6, 16] =
   sin(0.37 i + 0.1), PaddingMask(2, 6), dLoss/dOut = sin(0.53 i + 0.2):
   output, input gradient, worst parameter gradient (and which), in
   multiples of the type's unit roundoff u;
2. ExpectBertTinyCloseTo's: tools/torch/torch_models.py's bert_tiny, vocab
   97, dropout 0, 4 x 32 tokens (i * 7 + 3) mod 97, every 5th unpadded
   token predicted: the loss's relative difference and the worst gradient.
"""
import argparse
import math
import sys
import os

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402

FP32_LINEAR = F.linear
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def rounded(t, kind):
    return t.bfloat16().float() if kind == "bf16" else t.half().float()


class RoundedLinear(torch.autograd.Function):
    """y = x W^T + b with x, W and dy rounded to `kind`, fp32 products."""

    @staticmethod
    def forward(ctx, x, w, b, kind):
        ctx.save_for_backward(x, w)
        ctx.kind = kind
        ctx.has_bias = b is not None
        return FP32_LINEAR(rounded(x, kind), rounded(w, kind), b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        d = rounded(dy, ctx.kind)
        dx = d @ rounded(w, ctx.kind)
        dw = (d.reshape(-1, d.shape[-1]).t()
              @ rounded(x, ctx.kind).reshape(-1, x.shape[-1]))
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db, None


def use_precision(kind):
    F.linear = (FP32_LINEAR if kind == "fp32" else
                (lambda x, w, b=None: RoundedLinear.apply(x, w, b, kind)))


def formula(n, a, b):
    return torch.tensor([math.sin(a * i + b) for i in range(n)])


def padding_mask(n, s):
    """Sample b has its last min(2 b, s - 1) keys padded."""
    m = torch.zeros(n, s, dtype=torch.bool)
    for b in range(n):
        m[b, max(s - 2 * b, 1):] = True
    return m


def relative_l2(a, ref):
    return ((a - ref).norm() / ref.norm()).item()


def run_block(block, kind):
    use_precision(kind)
    x = formula(2 * 6 * 16, 0.37, 0.1).reshape(2, 6, 16).requires_grad_()
    mask = padding_mask(2, 6)
    if isinstance(block, torch.nn.MultiheadAttention):
        y = block(x, x, x, key_padding_mask=mask, need_weights=False)[0]
    else:
        y = block(x, src_key_padding_mask=mask)
    block.zero_grad()
    y.backward(formula(y.numel(), 0.53, 0.2).reshape(y.shape))
    use_precision("fp32")
    grads = {k: p.grad.clone() for k, p in block.named_parameters()}
    return y.detach(), x.grad, grads


def blocks(seeds):
    worst = {}
    for seed in range(seeds):
        for name in ("attention", "encoder"):
            torch.manual_seed(seed)
            block = (torch.nn.MultiheadAttention(16, 2, 0.0, batch_first=True)
                     if name == "attention" else
                     torch.nn.TransformerEncoderLayer(
                         16, 2, 32, 0.0, activation="gelu",
                         batch_first=True))
            with torch.no_grad():
                for p in block.parameters():
                    p.uniform_(-1.0, 1.0)
            ref = run_block(block, "fp32")
            for kind in ("bf16", "fp16"):
                got = run_block(block, kind)
                grad, which = max((relative_l2(got[2][k], ref[2][k]), k)
                                  for k in ref[2])
                key = (name, kind)
                w = worst.get(key, (0.0, 0.0, 0.0, ""))
                worst[key] = (max(w[0], relative_l2(got[0], ref[0])),
                              max(w[1], relative_l2(got[1], ref[1])),
                              *max((w[2], w[3]), (grad, which)))
    print(f"| block | type | output | input gradient | worst parameter "
          f"gradient | over {seeds} seeds, in multiples of u |")
    print("|---|---|---:|---:|---|---|")
    for (name, kind), (out, din, grad, which) in sorted(worst.items()):
        u = UNIT_ROUNDOFF[kind]
        print(f"| {name} | {kind} | {out:.3g} | {din:.3g} | {grad:.3g} "
              f"({which}) | {out / u:.1f} u, {din / u:.1f} u, "
              f"{grad / u:.1f} u |")


def run_bert(kind, seed):
    torch.manual_seed(seed)
    model = torch_models.bert("bert_tiny", 97, dropout=0.0)
    n, s = 4, 32
    ids = torch.tensor([(i * 7 + 3) % 97 for i in range(n * s)]).reshape(n, s)
    mask = padding_mask(n, s)
    labels = torch.full((n * s,), -100)
    for i in range(0, n * s, 5):
        if not mask.reshape(-1)[i]:
            labels[i] = ids.reshape(-1)[i]
    use_precision(kind)
    logits = model(ids, mask).reshape(n * s, -1)
    loss = F.cross_entropy(logits, labels, ignore_index=-100)
    loss.backward()
    use_precision("fp32")
    return loss.item(), {k: p.grad for k, p in model.named_parameters()}


def bert(seeds):
    print()
    print(f"| bert_tiny | loss, relative | worst gradient, relative L2 | "
          f"over {seeds} seeds |")
    print("|---|---:|---|---|")
    for kind in ("bf16", "fp16"):
        worst_loss, worst_grad = 0.0, (0.0, "")
        for seed in range(seeds):
            ref_loss, ref = run_bert("fp32", seed)
            loss, got = run_bert(kind, seed)
            worst_loss = max(worst_loss, abs(loss - ref_loss) / ref_loss)
            worst_grad = max(worst_grad, *(
                (relative_l2(got[k], ref[k]), k) for k in ref
                if ref[k].norm() > 0))
        print(f"| {kind} | {worst_loss:.2g} | {worst_grad[0]:.3g} "
              f"({worst_grad[1]}) | |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--bert_seeds", type=int, default=5)
    a = p.parse_args()
    if a.seeds < 1 or a.bert_seeds < 1:
        p.error("--seeds and --bert_seeds: expected at least 1")
    torch.set_num_threads(1)
    blocks(a.seeds)
    bert(a.bert_seeds)


if __name__ == "__main__":
    main()
