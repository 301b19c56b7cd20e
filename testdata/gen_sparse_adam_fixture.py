#!/usr/bin/env python3
"""Generates testdata/sparse_adam_fixture.txt with torch.optim.SparseAdam.

Run once with Debian's python3-torch (1.13: /usr/bin/python3); the output is
committed, so tests do not need torch. An embedding table of V rows of D
elements takes a row-sparse gradient each step (a random set of rows; one
row is never touched). torch 1.13's SparseAdam refuses a gradient of no
rows, and a step without a gradient does not advance its count; a shard's
chunk advances at every step of the job, as a whole table does under
SparseAdam when a batch touches any of its rows. The
hyperparameters are float32 values (given to torch as the doubles they
equal), as the shard holds them. Format, one record per line:
  case <name> <lr> <beta1> <beta2> <eps> <V> <D> <steps>
  w0 <V*D floats>
  g <step> <K> <K row ids> <K*D floats>   (the rows' gradient, row-major)
  w <step> <V*D floats>                   (the table after that step)
  m <step> <V*D floats>                   (exp_avg after that step)
  v <step> <V*D floats>                   (exp_avg_sq after that step)
Floats are written as repr() of the float32 value (exact as a double).
"""
import numpy as np
import torch

torch.manual_seed(41)
V, D, STEPS = 12, 5, 7


def f32(x):
    return float(np.float32(x))


cases = [
    ("default", f32(1e-3), f32(0.9), f32(0.999), f32(1e-8)),
    ("fast", f32(1e-2), f32(0.8), f32(0.99), f32(1e-6)),
    ("large_lr", f32(0.1), f32(0.5), f32(0.75), f32(1e-3)),
]


def fmt(t):
    return " ".join(repr(float(x)) for x in t.reshape(-1).tolist())


with open("sparse_adam_fixture.txt", "w") as f:
    for name, lr, b1, b2, eps in cases:
        w = torch.randn(V, D, dtype=torch.float32)
        p = torch.nn.Parameter(w.clone())
        opt = torch.optim.SparseAdam([p], lr=lr, betas=(b1, b2), eps=eps)
        f.write(f"case {name} {lr!r} {b1!r} {b2!r} {eps!r} {V} {D} {STEPS}\n")
        f.write("w0 " + fmt(w) + "\n")
        for s in range(1, STEPS + 1):
            # Rows 0 and 1 every step, row V-1 never, the rest at random.
            rest = torch.randperm(V - 3)[: int(torch.randint(0, V - 3, ()))]
            rows = torch.cat([torch.tensor([0, 1]), rest + 2]).sort().values
            k = rows.numel()
            vals = torch.randn(k, D, dtype=torch.float32) * (0.3 * s)
            if k > 2:
                vals[2, 1] = 0.0  # a touched row's zero still updates
            p.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), vals, (V, D))
            opt.step()
            st = opt.state[p]
            f.write(f"g {s} {k} " + " ".join(str(int(r)) for r in rows) +
                    (" " + fmt(vals) if k else "") + "\n")
            f.write(f"w {s} " + fmt(p.detach()) + "\n")
            f.write(f"m {s} " + fmt(st["exp_avg"]) + "\n")
            f.write(f"v {s} " + fmt(st["exp_avg_sq"]) + "\n")
