#!/usr/bin/env python3
"""Generates testdata/lenet5_fixture.txt: LeNet-5 forward and backward in
PyTorch 1.13 (Debian's python3-torch), on weights and inputs given by a
formula both sides compute, so only results are stored.

  value(p, i) = 0.1 * sin(0.7 * i + 1.3 * p)    for element i of parameter p
  input(i)    = 0.5 * cos(0.37 * i)             for element i of the input
Input [2, 1, 28, 28], labels [3, 7]. Lines:
  loss <float>
  logits <20 floats>
  grad <p> <numel> <sum> <sum_abs> <first 8 elements>
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

m = LeNet5()
with torch.no_grad():
    for p_idx, p in enumerate(m.parameters()):
        flat = torch.tensor([0.1 * math.sin(0.7 * i + 1.3 * p_idx)
                             for i in range(p.numel())], dtype=torch.float32)
        p.copy_(flat.view_as(p))
x = torch.tensor([0.5 * math.cos(0.37 * i) for i in range(2 * 784)],
                 dtype=torch.float32).view(2, 1, 28, 28)
labels = torch.tensor([3, 7])
logits = m(x)
loss = F.cross_entropy(logits, labels)
loss.backward()
with open("lenet5_fixture.txt", "w") as f:
    f.write(f"loss {loss.item()!r}\n")
    f.write("logits " + " ".join(repr(v) for v in logits.detach().flatten().tolist()) + "\n")
    for p_idx, p in enumerate(m.parameters()):
        g = p.grad.flatten().double()
        first = " ".join(repr(v) for v in p.grad.flatten()[:8].tolist())
        f.write(f"grad {p_idx} {p.numel()} {g.sum().item()!r} {g.abs().sum().item()!r} {first}\n")
