#!/usr/bin/python3
"""bert_tiny trained by pstrain and by PyTorch from the same initial weights
on the same batches (issue 41's acceptance check). Run from the repository
root with Debian's python3-torch (/usr/bin/python3) after

  bazel build //cli:pstrain //server:pstrain_ps //worker:pstrain_worker \\
      //tools:mlm_batches //text:fortunes_tokens

  /usr/bin/python3 tools/torch/bert_compare.py --steps=200
  /usr/bin/python3 tools/torch/bert_compare.py --steps=200 \\
      --model=bert_tiny_untied --sparse_embeddings

1. PyTorch builds tools/torch/torch_models.py's bert("bert_tiny", vocab,
   dropout=0) with torch.manual_seed(--seed) and writes its weights as a
   pstrain model file (init.safetensors).
2. `pstrain run` trains it (--init_from) on the "tokens" dataset (default:
   the fortune(6) corpus of //text:fortunes_tokens) with --workers workers
   of --batch_size sequences, sync PS (Adam on the shards), dropout 0,
   writing each worker's metrics (worker/metrics.h) and the final
   model.safetensors.
3. tools:mlm_batches writes the batches those workers trained on (the same
   sampler, permutation and BERT masking), and PyTorch trains the same
   model on them with torch.optim.Adam (the same lr, betas, epsilon): each
   step's loss is the mean over workers of each worker's MLM loss (mean
   over its masked tokens), as sync mode averages the workers' gradients.
4. The table: per --log_every window, pstrain's loss (the workers' mean
   of their window means, from workerJ.csv) against PyTorch's over the same
   steps and their ratio; then both final models' MLM loss (eval mode) on
   worker 0's first batch, pstrain's model.safetensors loaded into the
   PyTorch module (strict=True).

With --sparse_embeddings (a "_untied" --model): pstrain pushes and pulls
the token table by rows and its shards update it with lazy Adam; PyTorch's
token embedding is nn.Embedding(sparse=True) under torch.optim.SparseAdam
(the rest under torch.optim.Adam), the dense-gradient reference of the same
lazy update. Then also the final token tables side by side: the largest
difference, and the rows no batch read (unchanged from the initial weights
on both sides, bit for bit).

Dropout is 0 on both sides: the masks of a seeded dropout would differ
between the two implementations. Exit 0 when every ratio is within
--tolerance (0.02) of 1, else 1.
"""
import argparse
import csv
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def write_model_file(path, model, vocab, seq_len, name="bert_tiny"):
    """A pstrain model file (models/model_file.h) of `model`'s state_dict."""
    header, blobs, offset = {}, [], 0
    for name, t in model.state_dict().items():
        data = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {
        "format": "pstrain.model/1", "model": name,
        "input_chw": str(seq_len), "num_classes": str(vocab), "steps": "0",
        "dataset": "tokens"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_model_file(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    state = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = {"F32": "<f4", "I64": "<i8"}[info["dtype"]]
        state[name] = torch.from_numpy(
            np.frombuffer(data[a:b], dtype=dtype).copy().reshape(
                info["shape"]))
    return state


def read_batches(path):
    """tools/mlm_batches' file: [steps][workers] of (ids, mask, labels)."""
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:8] == b"PSMLMB01", path
    workers, batch, seq_len, steps, vocab = struct.unpack("<5i", raw[8:28])
    n = batch * seq_len
    pos, out = 28, []
    for _ in range(steps):
        row = []
        for _ in range(workers):
            ids = np.frombuffer(raw, "<i4", n, pos).reshape(batch, seq_len)
            pos += 4 * n
            mask = np.frombuffer(raw, "u1", n, pos).reshape(batch, seq_len)
            pos += n
            labels = np.frombuffer(raw, "<i4", n, pos)
            pos += 4 * n
            row.append((torch.from_numpy(ids.astype(np.int64)),
                        torch.from_numpy(mask.astype(bool)),
                        torch.from_numpy(labels.astype(np.int64))))
        out.append(row)
    return out, vocab, seq_len


def mlm_loss(model, ids, mask, labels, vocab):
    logits = model(ids, mask)
    return F.cross_entropy(logits.reshape(-1, vocab), labels,
                           ignore_index=-100)


def window_losses(metrics_dir, workers):
    """{step: mean over workers of their loss over the window to step}."""
    per_step = {}
    for w in range(workers):
        with open(os.path.join(metrics_dir, f"worker{w}.csv")) as f:
            for row in csv.DictReader(f):
                if row["loss"]:
                    per_step.setdefault(int(row["step"]), []).append(
                        float(row["loss"]))
    return {s: sum(v) / len(v) for s, v in per_step.items()
            if len(v) == workers}


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--log_every", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--data_dir", default="bazel-bin/text/fortunes")
    p.add_argument("--bin", default="bazel-bin")
    p.add_argument("--threads", type=int, default=1,
                   help="PyTorch's CPU threads")
    p.add_argument("--model", default="bert_tiny",
                   help="bert_tiny or bert_tiny_untied")
    p.add_argument("--sparse_embeddings", action="store_true",
                   help="row-sparse token table (lazy Adam; an _untied model)")
    p.add_argument("--num_ps", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    work = tempfile.mkdtemp(prefix="bert_compare.")
    batches_path = os.path.join(work, "batches.bin")
    run([f"{a.bin}/tools/mlm_batches", f"--data_dir={a.data_dir}",
         f"--workers={a.workers}", f"--batch_size={a.batch_size}",
         f"--steps={a.steps}", f"--steps_per_epoch={a.steps}",
         f"--seed={a.seed}", f"--output={batches_path}"])
    batches, vocab, seq_len = read_batches(batches_path)

    torch.manual_seed(a.seed)
    sparse = a.sparse_embeddings
    model = torch_models.bert(a.model, vocab, dropout=0.0, sparse=sparse)
    init = os.path.join(work, "init.safetensors")
    write_model_file(init, model, vocab, seq_len, a.model)
    initial_table = model.embeddings.token.weight.detach().clone()

    metrics = os.path.join(work, "metrics")
    ckpt = os.path.join(work, "ckpt")
    run([f"{a.bin}/cli/pstrain", "run", f"--model={a.model}",
         "--dataset=tokens", f"--data_dir={a.data_dir}",
         f"--num_ps={a.num_ps}", f"--sparse_embeddings={str(sparse).lower()}",
         f"--num_workers={a.workers}", f"--batch_size={a.batch_size}",
         "--epochs=1", f"--max_steps_per_epoch={a.steps}",
         f"--log_every_steps={a.log_every}", f"--lr={a.lr}",
         f"--seed={a.seed}", "--dropout=0", f"--init_from={init}",
         f"--metrics_dir={metrics}", f"--checkpoint_dir={ckpt}",
         f"--ps_binary={a.bin}/server/pstrain_ps",
         f"--worker_binary={a.bin}/worker/pstrain_worker"])
    ours = window_losses(metrics, a.workers)

    model.train()
    table = model.embeddings.token.weight
    dense = [p for p in model.parameters() if not (sparse and p is table)]
    opts = [torch.optim.Adam(dense, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)]
    if sparse:
        opts.append(torch.optim.SparseAdam([table], lr=a.lr,
                                           betas=(0.9, 0.999), eps=1e-8))
    theirs = []
    read = torch.zeros(vocab, dtype=torch.bool)  # rows any batch read
    for step in range(a.steps):
        for opt in opts:
            opt.zero_grad()
        losses = []
        for ids, mask, labels in batches[step]:
            read[ids.reshape(-1)] = True
            losses.append(mlm_loss(model, ids, mask, labels, vocab))
        loss = sum(losses) / len(losses)
        loss.backward()
        for opt in opts:
            opt.step()
        theirs.append(float(loss))

    print(f"\n{a.model}, vocab {vocab}, {a.workers} workers x "
          f"{a.batch_size} sequences of {seq_len}, sync PS, "
          f"{'lazy Adam (SparseAdam) on the token table, ' if sparse else ''}"
          f"Adam lr {a.lr}, dropout 0")
    print("#  steps  pstrain_loss  torch_loss   ratio")
    worst = 0.0
    for end in sorted(ours):
        window = theirs[end - a.log_every:end]
        ref = sum(window) / len(window)
        ratio = ours[end] / ref
        worst = max(worst, abs(ratio - 1))
        print(f"  {end - a.log_every + 1:>3}-{end:<4} {ours[end]:12.4f} "
              f"{ref:11.4f} {ratio:7.4f}")

    # Both final models on worker 0's first batch.
    trained = torch_models.bert(a.model, vocab, dropout=0.0)
    trained.load_state_dict(
        read_model_file(os.path.join(ckpt, "model.safetensors")), strict=True)
    if a.model.endswith("_untied"):
        ours_table = trained.embeddings.token.weight.detach()
        theirs_table = table.detach()
        unread = ~read
        print(f"# token table: max |pstrain - torch| "
              f"{float((ours_table - theirs_table).abs().max()):.3e} over "
              f"{int(read.sum())} rows read; {int(unread.sum())} rows no "
              f"batch read: unchanged in pstrain "
              f"{bool(torch.equal(ours_table[unread], initial_table[unread]))}"
              f", in torch "
              f"{bool(torch.equal(theirs_table[unread], initial_table[unread]))}")
    trained.eval()
    model.eval()
    ids, mask, labels = batches[0][0]
    with torch.no_grad():
        final_ours = float(mlm_loss(trained, ids, mask, labels, vocab))
        final_theirs = float(mlm_loss(model, ids, mask, labels, vocab))
    ratio = final_ours / final_theirs
    worst = max(worst, abs(ratio - 1))
    print(f"  final models  {final_ours:12.4f} {final_theirs:11.4f} "
          f"{ratio:7.4f}  (worker 0's first batch, eval mode)")
    print(f"# worst |ratio - 1|: {worst:.1e} (tolerance {a.tolerance}); "
          f"files in {work}")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
