#!/usr/bin/env python3
"""Generates testdata/bert_fixture.txt with PyTorch 1.13 (Debian's
python3-torch; run from testdata/ with /usr/bin/python3): the masked-language
-model head and a bert_tiny training step (issue 41), in the format of
transformer_fixture.txt ("case NAME", lines "TAG n v1 .. vn", "end").
models/bert_test.cc reads it; no torch at test time.

Case "mlm_head": the tied decoder and the MLM loss alone,
  logits = h W^T + b  (h [2, 5, 8], W [11, 8] the token table, b [11]),
  loss = F.cross_entropy(logits.view(-1, 11), labels.view(-1),
                         ignore_index=-100)
  input h(i) = sin(0.37 i + 0.1); param:weight 0.3 sin(0.7 i + 1.3 k) (k = 0),
  param:bias (k = 1); labels: position t of sample b is predicted (label
  (3 b + 5 t) % 11) when (b + t) % 3 == 0, else -100.
  Written: out (logits), loss, din (dL/dh), grad:weight, grad:bias.

Case "bert_tiny_adam": the same model and initial weights trained for 10
steps with torch.optim.Adam (lr 1e-3, PyTorch's defaults otherwise) on
batches of 4 x 32 tokens given by formulas of the step K: ids[b, t] =
(5 + (11 t + 17 b + 29 K + (t * t) % 13) % 92), sample 3 padded from
position 24; position t of sample b predicted when (t + b + K) % 6 == 0 and
not padding (label the id; the id becomes 4 when also (t + K) % 3 == 0).
Written per step: "ids:K", "mask:K", "labels:K"; then "losses" (10
values, each before its step's update).

Also testdata/bert_tiny_torch_keys.txt: "name dtype shape" of every
state_dict entry of bert("bert_tiny", vocab 97), as resnet18_torch_keys.txt
(models/model_file_test.cc compares a saved model.safetensors with it).

Case "bert_tiny": tools/torch/torch_models.py's bert("bert_tiny", vocab 97,
dropout 0) on a batch of 2 sequences of 128 tokens, training mode:
  parameter k (state_dict order) element i = 0.02 sin(0.7 i + 1.3 k)
  (LayerNorm weights 1 + that), as models/bert_test.cc sets them;
  ids[b, t] = (7 t + 31 b + 3) % 97; sample 1 has its last 40 positions
  padding (mask 1); labels: (t + b) % 7 == 0 and not padding -> the id,
  else -100; then the id of every fourth predicted token becomes 4 (the
  [MASK] id of this toy vocabulary).
  Written: input (ids), input2 (mask), labels, loss, logits_head (the
  first 64 logits) and, for every parameter, "grad:NAME" as its first 64
  values ("head:NAME") and the sum of squares ("sumsq:NAME").
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tools", "torch"))
import torch_models  # noqa: E402

torch.set_default_dtype(torch.float32)


def seq(n, f):
    return torch.tensor([f(i) for i in range(n)], dtype=torch.float32)


def line(tag, t):
    v = t.detach().flatten().tolist()
    return f"{tag} {len(v)} " + " ".join(repr(float(x)) for x in v) + "\n"


def mlm_head(f):
    n, s, e, v = 2, 5, 8, 11
    h = seq(n * s * e, lambda i: math.sin(0.37 * i + 0.1)).view(n, s, e)
    w = seq(v * e, lambda i: 0.3 * math.sin(0.7 * i)).view(v, e)
    b = seq(v, lambda i: 0.3 * math.sin(0.7 * i + 1.3))
    labels = torch.tensor([[(3 * bb + 5 * t) % v if (bb + t) % 3 == 0 else -100
                            for t in range(s)] for bb in range(n)])
    for t in (h, w, b):
        t.requires_grad_(True)
    logits = F.linear(h, w, b)
    loss = F.cross_entropy(logits.view(-1, v), labels.view(-1),
                           ignore_index=-100)
    loss.backward()
    f.write("case mlm_head\n")
    f.write(line("input", h))
    f.write(line("param:weight", w))
    f.write(line("param:bias", b))
    f.write(line("labels", labels.float()))
    f.write(line("out", logits))
    f.write(line("loss", loss))
    f.write(line("din", h.grad))
    f.write(line("grad:weight", w.grad))
    f.write(line("grad:bias", b.grad))
    f.write("end\n")


def set_formula_weights(model):
    with torch.no_grad():
        for k, (name, p) in enumerate(model.state_dict().items()):
            v = seq(p.numel(), lambda i: 0.02 * math.sin(0.7 * i + 1.3 * k))
            if "norm" in name and name.endswith("weight"):
                v = v + 1.0
            p.copy_(v.view_as(p))


def bert_tiny(f):
    vocab, n, s, padded, mask_id = 97, 2, 128, 40, 4
    model = torch_models.bert("bert_tiny", vocab, dropout=0.0)
    set_formula_weights(model)
    model.train()
    ids = torch.tensor([[(7 * t + 31 * b + 3) % vocab for t in range(s)]
                        for b in range(n)])
    pad = torch.zeros(n, s, dtype=torch.bool)
    pad[1, s - padded:] = True
    labels = torch.full((n, s), -100, dtype=torch.long)
    predicted = 0
    for b in range(n):
        for t in range(s):
            if (t + b) % 7 == 0 and not pad[b, t]:
                labels[b, t] = ids[b, t]
                if predicted % 4 == 0:
                    ids[b, t] = mask_id
                predicted += 1
    logits = model(ids, pad)
    loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1),
                           ignore_index=-100)
    loss.backward()
    f.write("case bert_tiny\n")
    f.write(line("input", ids.float()))
    f.write(line("input2", pad.float()))
    f.write(line("labels", labels.float()))
    f.write(line("loss", loss))
    f.write(line("logits_head", logits.flatten()[:64]))
    for name, p in model.named_parameters():
        g = p.grad.double()
        f.write(line("head:" + name, p.grad.flatten()[:64]))
        f.write(line("sumsq:" + name, (g * g).sum().view(1)))
    f.write("end\n")


def bert_tiny_adam(f):
    vocab, n, s, steps = 97, 4, 32, 10
    model = torch_models.bert("bert_tiny", vocab, dropout=0.0)
    set_formula_weights(model)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    f.write("case bert_tiny_adam\n")
    losses = []
    for k in range(steps):
        ids = torch.tensor([[5 + (11 * t + 17 * b + 29 * k + (t * t) % 13) % 92
                             for t in range(s)] for b in range(n)])
        pad = torch.zeros(n, s, dtype=torch.bool)
        pad[3, 24:] = True
        labels = torch.full((n, s), -100, dtype=torch.long)
        for b in range(n):
            for t in range(s):
                if (t + b + k) % 6 == 0 and not pad[b, t]:
                    labels[b, t] = ids[b, t]
                    if (t + k) % 3 == 0:
                        ids[b, t] = 4
        f.write(line(f"ids:{k}", ids.float()))
        f.write(line(f"mask:{k}", pad.float()))
        f.write(line(f"labels:{k}", labels.float()))
        opt.zero_grad()
        logits = model(ids, pad)
        loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1),
                               ignore_index=-100)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    f.write(line("losses", torch.tensor(losses)))
    f.write("end\n")


def write_keys():
    model = torch_models.bert("bert_tiny", 97)
    with open("bert_tiny_torch_keys.txt", "w") as f:
        for name, t in model.state_dict().items():
            shape = ",".join(str(d) for d in t.shape)
            f.write(f"{name} F32 {shape}\n")


def main():
    torch.manual_seed(0)
    with open("bert_fixture.txt", "w") as f:
        mlm_head(f)
        bert_tiny(f)
        bert_tiny_adam(f)
    write_keys()


if __name__ == "__main__":
    main()
