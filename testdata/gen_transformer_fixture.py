#!/usr/bin/env python3
"""Generates testdata/transformer_fixture.txt with PyTorch 1.13 (Debian's
python3-torch; run from testdata/): the transformer layers' forward and
backward (issue 41), on inputs and weights given by formulas, in the format
of layers_fixture.txt (gen_layers_fixture.py). models/transformer_test.cc
reads it; no torch at test time.

For each case, "case NAME", then lines "TAG n v1 .. vn":
  input:        x(i) = sin(0.37 i + 0.1) * a + c (a, c per case); for the
                embedding, token ids (as floats)
  input2:       attention's key padding mask [N, S], 1.0 = padding key
  param:NAME:   0.3 sin(0.7 i + 1.3 k) for parameter k (LayerNorm weights:
                1 + 0.3 sin(...))
  dout:         cos(0.53 i)
  out, din, grad:NAME: training-mode forward and backward (dropout 0)

Modules: nn.LayerNorm (eps 1e-5), F.gelu (erf form), two nn.Embedding
(token and position, summed: BERT's embeddings without token types),
nn.MultiheadAttention(batch_first=True, bias=True) as self-attention with
key_padding_mask, need_weights=False, and nn.TransformerEncoderLayer
(batch_first, activation="gelu", post-LN, dropout 0) with
src_key_padding_mask.
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


def named(module):
    """named_parameters() without a wrapper's attribute (mha., layer.)."""
    strip = getattr(module, "strip", "")
    return [(n[len(strip):] if n.startswith(strip) else n, p)
            for n, p in module.named_parameters()]


def set_params(module, layernorm_weights=()):
    with torch.no_grad():
        for k, (name, p) in enumerate(named(module)):
            v = seq(p.numel(), lambda i: 0.3 * math.sin(0.7 * i + 1.3 * k))
            if name in layernorm_weights:
                v = v + 1.0
            p.copy_(v.view_as(p))


class TokenPositionEmbedding(nn.Module):
    def __init__(self, vocab, max_positions, hidden):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.token(ids) + self.position(positions)


class SelfAttention(nn.Module):
    strip = "mha."

    def __init__(self, hidden, heads):
        super().__init__()
        self.mha = nn.MultiheadAttention(hidden, heads, dropout=0.0, bias=True,
                                         batch_first=True)

    def forward(self, x, pad):
        out, _ = self.mha(x, x, x, key_padding_mask=pad, need_weights=False)
        return out


def masks(n, s, padded):
    """[n, s] bool: sample b has its last padded[b] keys padding."""
    m = torch.zeros(n, s, dtype=torch.bool)
    for b, p in enumerate(padded):
        if p:
            m[b, s - p:] = True
    return m


def write_case(f, name, module, x, dout_of, extra=None, ln=(), float_x=True):
    f.write(f"case {name}\n")
    f.write(line("input", x))
    if extra is not None:
        f.write(line("input2", extra.float()))
    if module is not None:
        set_params(module, ln)
        for pname, p in named(module):
            f.write(line("param:" + pname, p))
        module.train()
    if float_x:
        x.requires_grad_(True)
    if module is None:
        out = F.gelu(x)
    elif extra is None:
        out = module(x)
    else:
        out = module(x, extra)
    dout = seq(out.numel(), lambda i: math.cos(0.53 * i)).view_as(out)
    out.backward(dout)
    f.write(line("out", out))
    f.write(line("dout", dout))
    if float_x:
        f.write(line("din", x.grad))
    if module is not None:
        for pname, p in named(module):
            f.write(line("grad:" + pname, p.grad))
    f.write("end\n")


def x_of(shape, a=1.0, c=0.0):
    n = math.prod(shape)
    return seq(n, lambda i: a * math.sin(0.37 * i + 0.1) + c).view(shape)


def main():
    with open("transformer_fixture.txt", "w") as f:
        write_case(f, "layernorm", nn.LayerNorm(8), x_of((2, 3, 8), 2.0, 0.5),
                   None, ln=("weight",))
        write_case(f, "layernorm_2d", nn.LayerNorm(6), x_of((4, 6), 0.7, -1.0),
                   None, ln=("weight",))
        write_case(f, "gelu", None, x_of((2, 3, 8), 3.0), None)
        # Ids with repeats (rows summed in the gradient); S = 5 of 7
        # positions (rows 5, 6 get no gradient); token 10 unused.
        ids = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
        write_case(f, "embedding", TokenPositionEmbedding(11, 7, 6), ids, None,
                   float_x=False)
        write_case(f, "mha", SelfAttention(8, 2), x_of((2, 5, 8)), None,
                   extra=masks(2, 5, [0, 2]))
        write_case(f, "mha_heads4", SelfAttention(12, 4), x_of((3, 4, 12), 1.5),
                   None, extra=masks(3, 4, [1, 0, 3]))
        enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                         activation="gelu", batch_first=True,
                                         norm_first=False)
        write_case(f, "encoder", EncoderWithMask(enc), x_of((2, 5, 8)), None,
                   extra=masks(2, 5, [1, 0]),
                   ln=("norm1.weight", "norm2.weight"))


class EncoderWithMask(nn.Module):
    strip = "layer."

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, pad):
        return self.layer(x, src_key_padding_mask=pad)


if __name__ == "__main__":
    main()
