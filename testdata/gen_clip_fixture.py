"""Generates testdata/clip_fixture.txt: gradient clipping by global norm as
torch.nn.utils.clip_grad_norm_ (PyTorch 1.13) on the averaged gradients of
worker/gradient_exchange_test.cc's two ranks, then one torch.optim.SGD step.

Run: /usr/bin/python3 testdata/gen_clip_fixture.py > testdata/clip_fixture.txt

Gradients: rank r's tensor t, element i: (r + 1) * 0.5 + t * 0.25 - i * 0.0625
(3 tensors of 1000, fp32), averaged over 2 ranks as allreduce does (sum,
times 1/2); weights 0.1; SGD lr 0.1, no momentum; max_norm 5.

Output lines: "total_norm X" (clip_grad_norm_'s return value), then
"weights T I VALUE" for every element after the step (VALUE with 9
significant digits, exact for fp32).
"""
import torch

K_TENSORS, K_ELEMENTS, SIZE = 3, 1000, 2
MAX_NORM, LR = 5.0, 0.1

params = []
for t in range(K_TENSORS):
    p = torch.nn.Parameter(torch.full((K_ELEMENTS,), 0.1, dtype=torch.float32))
    i = torch.arange(K_ELEMENTS, dtype=torch.float32)
    total = torch.zeros(K_ELEMENTS, dtype=torch.float32)
    for r in range(SIZE):
        total += (r + 1) * 0.5 + t * 0.25 - i * 0.0625
    p.grad = total * (1.0 / SIZE)
    params.append(p)
norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
torch.optim.SGD(params, lr=LR).step()
print("total_norm %.9g" % norm.item())
for t, p in enumerate(params):
    for i, v in enumerate(p.detach().tolist()):
        print("weights %d %d %.9g" % (t, i, v))
