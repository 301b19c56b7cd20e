#!/usr/bin/env python3
"""Generates testdata/optimizer_fixture.txt with torch.optim.SGD and
torch.optim.lr_scheduler (optim/optimizer_test.cc reads it).

Run once with Debian's python3-torch (1.13) from testdata/; the output is
committed, so tests do not need torch. Format, one record per line:
  sgd <name> <lr> <momentum> <dampening> <nesterov 0|1> <weight_decay> <n> <steps>
  w0 <n floats>
  g <step> <n floats>        (one line per step)
  w <step> <n floats>        (weights after that step)
  lr <name> <lr> <decay> <warmup_steps> <warmup_start_factor> <step_size>
     <gamma> <total_steps> <lr_min> <steps>     (one line)
  at <step> <lr>             (the lr of the update at 0-based step)
"""
import math

import torch

torch.manual_seed(11)
N, STEPS = 16, 6
sgd_cases = [
    # name, lr, momentum, dampening, nesterov, weight_decay
    ("plain", 0.1, 0.0, 0.0, False, 0.0),
    ("plain_wd", 0.05, 0.0, 0.0, False, 0.01),
    ("momentum", 0.1, 0.9, 0.0, False, 0.0),
    ("momentum_damp_wd", 0.03, 0.8, 0.3, False, 1e-3),
    ("nesterov", 0.1, 0.9, 0.0, True, 0.0),
    ("nesterov_wd", 0.01, 0.95, 0.0, True, 5e-4),
]


def fmt(t):
    return " ".join(repr(float(x)) for x in t.tolist())


def sequential(opt, warmup, start_factor, decay):
    """torch's schedule: LinearLR warmup then `decay` (SequentialLR)."""
    if warmup == 0:
        return decay(opt)
    warm = torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=start_factor, end_factor=1.0, total_iters=warmup)
    return torch.optim.lr_scheduler.SequentialLR(
        opt, [warm, decay(opt)], milestones=[warmup])


with open("optimizer_fixture.txt", "w") as f:
    for name, lr, mom, damp, nest, wd in sgd_cases:
        w = torch.randn(N, dtype=torch.float32)
        p = torch.nn.Parameter(w.clone())
        opt = torch.optim.SGD([p], lr=lr, momentum=mom, dampening=damp,
                              nesterov=nest, weight_decay=wd)
        f.write(f"sgd {name} {lr!r} {mom!r} {damp!r} {int(nest)} {wd!r} "
                f"{N} {STEPS}\n")
        f.write("w0 " + fmt(w) + "\n")
        for s in range(1, STEPS + 1):
            g = torch.randn(N, dtype=torch.float32) * (0.5 * s)
            p.grad = g.clone()
            opt.step()
            f.write(f"g {s} " + fmt(g) + "\n")
            f.write(f"w {s} " + fmt(p.detach()) + "\n")

    LR, TOTAL = 0.1, 40
    # name, decay, warmup, start_factor, step_size, gamma, lr_min
    schedules = [
        ("step", "step", 0, 1.0, 7, 0.5, 0.0),
        ("cosine", "cosine", 0, 1.0, 0, 0.1, 0.001),
        ("warmup", "constant", 10, 0.25, 0, 0.1, 0.0),
        ("warmup_step", "step", 5, 0.1, 10, 0.3, 0.0),
        ("warmup_cosine", "cosine", 8, 0.01, 0, 0.1, 0.0),
    ]
    for name, decay, warmup, sf, step_size, gamma, lr_min in schedules:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=LR)
        if decay == "step":
            make = lambda o: torch.optim.lr_scheduler.StepLR(
                o, step_size=step_size, gamma=gamma)
        elif decay == "cosine":
            make = lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
                o, T_max=TOTAL - warmup, eta_min=lr_min)
        else:
            make = lambda o: torch.optim.lr_scheduler.ConstantLR(
                o, factor=1.0, total_iters=0)
        sched = sequential(opt, warmup, sf, make)
        f.write(f"lr {name} {LR!r} {decay} {warmup} {sf!r} {step_size} "
                f"{gamma!r} {TOTAL} {lr_min!r} {TOTAL}\n")
        for t in range(TOTAL):
            f.write(f"at {t} {opt.param_groups[0]['lr']!r}\n")
            opt.step()
            sched.step()
