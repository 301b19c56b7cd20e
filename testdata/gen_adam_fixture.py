#!/usr/bin/env python3
"""Generates testdata/adam_fixture.txt with torch.optim.Adam and AdamW.

Run once with Debian's python3-torch (1.13); the output is committed, so
tests do not need torch. Format, one record per line:
  case <name> <lr> <beta1> <beta2> <eps> <weight_decay> <n> <steps>
  w0 <n floats>
  g <step> <n floats>        (one line per step)
  w <step> <n floats>        (weights after that step)
"""
import torch

torch.manual_seed(7)
N, STEPS = 16, 5
cases = [
    ("adam", torch.optim.Adam, 1e-3, 0.9, 0.999, 1e-8, 0.0),
    ("adam_lr1e-2", torch.optim.Adam, 1e-2, 0.8, 0.99, 1e-6, 0.0),
    ("adamw", torch.optim.AdamW, 1e-3, 0.9, 0.999, 1e-8, 0.01),
    ("adamw_strong", torch.optim.AdamW, 5e-2, 0.9, 0.999, 1e-8, 0.1),
]
def fmt(t):
    return " ".join(repr(float(x)) for x in t.tolist())
with open("adam_fixture.txt", "w") as f:
    for name, cls, lr, b1, b2, eps, wd in cases:
        w = torch.randn(N, dtype=torch.float32)
        p = torch.nn.Parameter(w.clone())
        opt = cls([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        f.write(f"case {name} {lr!r} {b1!r} {b2!r} {eps!r} {wd!r} {N} {STEPS}\n")
        f.write("w0 " + fmt(w) + "\n")
        for s in range(1, STEPS + 1):
            g = torch.randn(N, dtype=torch.float32) * (0.1 * s)
            p.grad = g.clone()
            opt.step()
            f.write(f"g {s} " + fmt(g) + "\n")
            f.write(f"w {s} " + fmt(p.detach()) + "\n")
