#!/usr/bin/env python3
"""Generates testdata/layers_fixture.txt and testdata/models_fixture.txt with
PyTorch 1.13 (Debian's python3-torch): every layer's forward and backward,
and whole zoo models, on inputs and weights given by formulas both sides can
compute, so only results are stored.

layers_fixture.txt: for each case, "case NAME", then lines "TAG n v1 .. vn":
  input, input2: x(i) = sin(0.37 i + 0.1) (input2: cos(0.23 i)); pooling
                 cases use x(i) = sin(1.37 i) * (1 + 0.001 i) (no ties)
  param:NAME:    0.3 sin(0.7 i + 1.3 k) for parameter k (BatchNorm weight:
                 1 + 0.3 sin(...))
  dout:          cos(0.53 i)
  out, din, din2, grad:NAME: training-mode forward and backward
  buffer:NAME:   BatchNorm running statistics after that one forward
  eval_out:      eval-mode forward afterwards

models_fixture.txt: for each model, "model NAME C H W K", then
  loss, logits (training mode; for models with dropout: eval mode only),
  grad:K sum sum_abs (per parameter k, in model order), buffersum, eval_logits.
  Weights: parameter k element i = a_k sin(0.7 i + 1.3 k) with
  a_k = sqrt(3 / fan_in) for tensors of 2+ dims (fan_in = numel / dim 0),
  1-D "weight" (BatchNorm): 0.2 + 0.1 sin(...), 1-D bias: 0.1 sin(...).
  (BatchNorm weights well below 1 keep deep residual stacks well
  conditioned: at 1.0, ResNet-50's fp32 and fp64 gradients differ by 6%.)
  Input [2, C, H, W]: x(i) = sin(0.37 i + 0.1); labels [3, 7].
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float32)


def seq(n, f):
    return torch.tensor([f(i) for i in range(n)], dtype=torch.float32)


def line(tag, t):
    v = t.detach().flatten().tolist()
    return f"{tag} {len(v)} " + " ".join(repr(float(x)) for x in v) + "\n"


def layer_cases():
    return [
        ("conv_bias", nn.Conv2d(3, 4, 3, 1, 1, bias=True), (2, 3, 5, 5), 1),
        ("conv_stride2_nobias", nn.Conv2d(3, 4, 3, 2, 1, bias=False), (2, 3, 6, 6), 1),
        ("conv1x1_stride2", nn.Conv2d(4, 6, 1, 2, 0, bias=False), (2, 4, 5, 5), 1),
        ("conv7x7_stride2", nn.Conv2d(3, 4, 7, 2, 3, bias=False), (1, 3, 9, 9), 1),
        ("batchnorm", nn.BatchNorm2d(3), (4, 3, 3, 2), 1),
        ("relu", nn.ReLU(), (2, 3, 4, 4), 1),
        ("maxpool3s2p1", nn.MaxPool2d(3, 2, 1), (2, 3, 6, 7), 1),
        ("maxpool2", nn.MaxPool2d(2, 2), (2, 2, 6, 6), 1),
        ("avgpool2", nn.AvgPool2d(2, 2), (2, 2, 6, 4), 1),
        ("avgpool3s2p1", nn.AvgPool2d(3, 2, 1), (2, 2, 5, 5), 1),
        ("globalavgpool", nn.AdaptiveAvgPool2d(1), (2, 4, 3, 5), 1),
        ("linear", nn.Linear(12, 5), (3, 12), 1),
        ("flatten", nn.Flatten(), (2, 3, 2, 2), 1),
        ("add", None, (2, 3, 2, 2), 2),
    ]


def write_layers(path):
    with open(path, "w") as f:
        for name, layer, shape, num_inputs in layer_cases():
            n = math.prod(shape)
            if "pool" in name:
                x = seq(n, lambda i: math.sin(1.37 * i) * (1 + 0.001 * i))
            else:
                x = seq(n, lambda i: math.sin(0.37 * i + 0.1))
            x = x.view(shape).requires_grad_(True)
            f.write(f"case {name}\n")
            f.write(line("input", x))
            inputs = [x]
            if num_inputs == 2:
                x2 = seq(n, lambda i: math.cos(0.23 * i)).view(shape).requires_grad_(True)
                f.write(line("input2", x2))
                inputs.append(x2)
            if layer is not None:
                with torch.no_grad():
                    for k, (pname, p) in enumerate(layer.named_parameters()):
                        v = seq(p.numel(), lambda i: 0.3 * math.sin(0.7 * i + 1.3 * k))
                        if isinstance(layer, nn.BatchNorm2d) and pname == "weight":
                            v = v + 1.0
                        p.copy_(v.view_as(p))
                for pname, p in layer.named_parameters():
                    f.write(line("param:" + pname, p))
                layer.train()
                out = layer(x)
            else:
                out = inputs[0] + inputs[1]
            dout = seq(out.numel(), lambda i: math.cos(0.53 * i)).view_as(out)
            out.backward(dout)
            f.write(line("out", out))
            f.write(line("dout", dout))
            f.write(line("din", x.grad))
            if num_inputs == 2:
                f.write(line("din2", inputs[1].grad))
            if layer is not None:
                for pname, p in layer.named_parameters():
                    f.write(line("grad:" + pname, p.grad))
                for bname, b in layer.named_buffers():
                    if bname != "num_batches_tracked":
                        f.write(line("buffer:" + bname, b))
                if isinstance(layer, nn.BatchNorm2d):
                    layer.eval()
                    with torch.no_grad():
                        f.write(line("eval_out", layer(x)))
            f.write("end\n")


import os
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "torch"))
from torch_models import build  # noqa: E402


def set_weights(m):
    with torch.no_grad():
        for k, p in enumerate(m.parameters()):
            n = p.numel()
            if p.dim() >= 2:
                a = math.sqrt(3.0 / (n / p.shape[0]))
                v = seq(n, lambda i: a * math.sin(0.7 * i + 1.3 * k))
            elif p is not None and n and p.dim() == 1 and is_bn_weight(m, p):
                v = seq(n, lambda i: 0.2 + 0.1 * math.sin(0.7 * i + 1.3 * k))
            else:
                v = seq(n, lambda i: 0.1 * math.sin(0.7 * i + 1.3 * k))
            p.copy_(v.view_as(p))


def is_bn_weight(m, p):
    return any(mod.weight is p for mod in m.modules() if isinstance(mod, nn.BatchNorm2d))


def write_models(path):
    cases = [("resnet18", 3, 16, 10), ("resnet50", 3, 16, 10),
             ("resnet18", 1, 28, 10), ("alexnet", 3, 32, 10), ("vgg16", 3, 32, 10)]
    with open(path, "w") as f:
        for name, c, size, k in cases:
            torch.manual_seed(0)
            m = build(name, c, size, k)
            set_weights(m)
            x = seq(2 * c * size * size, lambda i: math.sin(0.37 * i + 0.1)).view(2, c, size, size)
            labels = torch.tensor([3, 7])
            f.write(f"model {name} {c} {size} {size} {k}\n")
            has_dropout = any(isinstance(mod, nn.Dropout) for mod in m.modules())
            if not has_dropout:
                m.train()
                logits = m(x)
                loss = F.cross_entropy(logits, labels)
                loss.backward()
                f.write(f"loss 1 {loss.item()!r}\n")
                f.write(line("logits", logits))
                for kk, p in enumerate(m.parameters()):
                    g = p.grad.double()
                    f.write(f"grad:{kk} 2 {g.sum().item()!r} {g.abs().sum().item()!r}\n")
                bsum = sum(b.double().sum().item() for n_, b in m.named_buffers()
                           if not n_.endswith("num_batches_tracked"))
                f.write(f"buffersum 1 {bsum!r}\n")
            m.eval()
            with torch.no_grad():
                f.write(line("eval_logits", m(x)))
            f.write("end\n")


if __name__ == "__main__":
    write_layers("layers_fixture.txt")
    write_models("models_fixture.txt")
