#!/usr/bin/env python3
"""AlexNet, ResNet-18 and VGG-16 trained from a tiny-ImageNet-layout folder
of 64x64 JPEG files: pstrain against PyTorch on the same files (issue 26).

The folder (made here with PIL unless it exists: --classes classes of
--train_per_class training and --val_per_class validation images, each class
a colour and a stripe direction with noise, JPEG quality 90) has the
tiny-ImageNet layout: wnids.txt, train/<wnid>/images/<wnid>_<i>.JPEG,
val/images/val_<j>.JPEG labelled by val/val_annotations.txt.

For each model in --models:
  pstrain  `pstrain run --dataset=image_folder --stream_images
           --image_size=64 --mode=allreduce --num_workers=1` (one process, no
           PS: the same work as one PyTorch process), Adam lr 1e-3, batch
           --batch_size, --steps steps; throughput from its result table
           (training samples / training time), the loss logged at the first
           and last --log_every steps, test accuracy on val/;
  PyTorch  torch 1.13 (Debian's python3-torch) with the same model
           (tools/torch/torch_models.py), torch.set_num_threads(--threads), a
           DataLoader with --loader_workers worker processes decoding each
           file with PIL (libjpeg-turbo), /255, shuffled, the same batch,
           Adam lr 1e-3 and number of steps, timed from the first step's
           start to the last step's end (loading included, as pstrain's).
Columns: samples/s of each, their ratio (pstrain / PyTorch), each side's
loss at the first and the last step (correctness: both must fall), and the
exit status.

--workers=1,2 adds, for each worker count W > 1, a second table: W workers
of pstrain with a sync PS (`--mode=sync --num_ps=1`) and with allreduce over
Gloo (`--mode=allreduce`), against PyTorch's DistributedDataParallel over
Gloo with W processes (torch.multiprocessing.spawn on 127.0.0.1), each
with --threads / W compute threads, a DistributedSampler and its own
DataLoader; --batch_size per worker, the same Adam and steps. Samples/s
is the job's: all workers' samples over the time from the first step to
the last (PyTorch: rank 0 between two barriers; pstrain: its result
table). pstrain's local job gives each of its processes its share of the
cores as well.

Usage (from the repository root, after `bazel build //cli:pstrain
//worker:pstrain_worker`):
  /usr/bin/python3 bench/tiny_imagenet_bench.py --dir=/tmp/tin \\
      --models=alexnet,resnet18,vgg16 --steps=40
"""

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "torch"))

ROW = re.compile(r"^\|\s*\d*\s*\|\s*\d+\s*\|\s*(\w+)\s*\|\s*(\w+)\s*\|.*\|"
                 r"\s*([\d.]+) s\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*$")
LOSS = re.compile(r"Step(\d+):.*loss ([\d.]+)")


def make_folder(root, classes, train_per_class, val_per_class, seed):
    from PIL import Image
    import numpy as np
    rng = np.random.default_rng(seed)
    wnids = ["n%08d" % (1000 + c) for c in range(classes)]
    size = 64
    yy, xx = np.mgrid[0:size, 0:size]

    def image(c):
        colour = np.array([(c * 37) % 256, (c * 91) % 256, (c * 173) % 256],
                          dtype=np.float32)
        angle = (c % 8) * np.pi / 8
        stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) *
                         (0.2 + 0.05 * (c % 5)))
        pixels = (colour[None, None, :] * 0.6 + 50 * stripes[:, :, None] +
                  rng.normal(0, 25, (size, size, 3)))
        return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

    os.makedirs(os.path.join(root, "val", "images"))
    with open(os.path.join(root, "wnids.txt"), "w") as f:
        f.write("\n".join(wnids) + "\n")
    for c, wnid in enumerate(wnids):
        folder = os.path.join(root, "train", wnid, "images")
        os.makedirs(folder)
        for i in range(train_per_class):
            image(c).save(os.path.join(folder, "%s_%d.JPEG" % (wnid, i)),
                          quality=90)
    with open(os.path.join(root, "val", "val_annotations.txt"), "w") as f:
        j = 0
        for c, wnid in enumerate(wnids):
            for _ in range(val_per_class):
                name = "val_%d.JPEG" % j
                image(c).save(os.path.join(root, "val", "images", name),
                              quality=90)
                f.write("%s\t%s\t0\t0\t63\t63\n" % (name, wnid))
                j += 1


def run_pstrain(args, model, mode="allreduce", workers=1):
    cmd = [args.pstrain, "run", "--dataset=image_folder",
           "--data_dir=" + args.dir, "--stream_images", "--image_size=64",
           "--model=" + model, "--mode=" + mode,
           "--num_workers=%d" % workers,
           "--epochs=1", "--max_steps_per_epoch=%d" % args.steps,
           "--batch_size=%d" % args.batch_size,
           "--log_every_steps=%d" % args.log_every]
    if mode == "sync":
        cmd.append("--num_ps=1")
    if args.worker_binary:
        cmd.append("--worker_binary=" + args.worker_binary)
    if args.ps_binary:
        cmd.append("--ps_binary=" + args.ps_binary)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout_s)
    losses = [float(m.group(2)) for m in map(LOSS.search,
                                             proc.stdout.splitlines()) if m]
    for line in proc.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            return (float(m.group(4)), losses, float(m.group(5)),
                    proc.returncode)
    sys.stderr.write("no result row in:\n" + proc.stdout[-3000:] + "\n")
    return 0.0, losses, 0.0, proc.returncode or 1


def training_files(root):
    wnids = open(os.path.join(root, "wnids.txt")).read().split()
    files = []
    for label, wnid in enumerate(sorted(wnids)):
        folder = os.path.join(root, "train", wnid, "images")
        files += [(os.path.join(folder, n), label)
                  for n in sorted(os.listdir(folder))]
    return files, len(wnids)


class JpegFiles:
    """A map-style dataset of (path, label): PIL decode, /255, normalised."""

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image
        path, label = self.files[i]
        with Image.open(path) as im:
            x = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
        x = (torch.from_numpy(x).permute(2, 0, 1) - 0.5) / 0.25
        return x, label


def train_steps(args, net, loader, on_epoch=None):
    """--steps steps of Adam (lr 1e-3) over `loader`, epoch after epoch;
    returns the loss every --log_every steps."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    losses = []
    steps = 0
    epoch = 0
    while steps < args.steps:
        if on_epoch is not None:
            on_epoch(epoch)
        epoch += 1
        for x, y in loader:
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if steps % args.log_every == 0:
                losses.append(float(loss))
            if steps == args.steps:
                break
    return losses


def ddp_worker(rank, world, args, model, port, results):
    import torch
    import torch.distributed as dist
    from torch_models import build_any

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)  # the same initial weights (DDP also broadcasts)
    torch.set_num_threads(max(1, args.threads // world))
    files, classes = training_files(args.dir)
    data = JpegFiles(files)
    sampler = torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=1,
        drop_last=True)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        num_workers=args.loader_workers)
    net = torch.nn.parallel.DistributedDataParallel(
        build_any(model, 3, 64, classes))
    dist.barrier()
    start = time.perf_counter()
    losses = train_steps(args, net, loader, sampler.set_epoch)
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put((world * args.steps * args.batch_size / seconds, losses))
    dist.destroy_process_group()


def run_ddp(args, model, world):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(ddp_worker, args=(world, args, model, port, results),
             nprocs=world, join=True)
    return results.get()


def run_torch(args, model):
    import torch
    from torch_models import build_any

    torch.manual_seed(1)
    torch.set_num_threads(args.threads)
    files, classes = training_files(args.dir)
    loader = torch.utils.data.DataLoader(
        JpegFiles(files), batch_size=args.batch_size, shuffle=True,
        drop_last=True, num_workers=args.loader_workers)
    net = build_any(model, 3, 64, classes)
    start = time.perf_counter()
    losses = train_steps(args, net, loader)
    seconds = time.perf_counter() - start
    return args.steps * args.batch_size / seconds, losses


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/tiny-imagenet-synthetic")
    p.add_argument("--classes", type=int, default=200)
    p.add_argument("--train_per_class", type=int, default=20)
    p.add_argument("--val_per_class", type=int, default=5)
    p.add_argument("--models", default="alexnet,resnet18,vgg16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log_every", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--loader_workers", type=int, default=1)
    p.add_argument("--timeout_s", type=int, default=3600)
    p.add_argument("--pstrain", default="bazel-bin/cli/pstrain")
    p.add_argument("--worker_binary", default="")
    p.add_argument("--ps_binary", default="")
    p.add_argument("--workers", default="1",
                   help="worker counts; each W > 1 adds a row per model to "
                        "the PS / allreduce / DDP table")
    args = p.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    if not os.path.exists(os.path.join(args.dir, "wnids.txt")):
        t = time.time()
        make_folder(args.dir, args.classes, args.train_per_class,
                    args.val_per_class, 1)
        print("# made %s: %d classes, %d training and %d val JPEG files "
              "(64x64) in %.0f s" % (args.dir, args.classes,
                                     args.classes * args.train_per_class,
                                     args.classes * args.val_per_class,
                                     time.time() - t), flush=True)

    def trend(losses):
        if len(losses) < 2:
            return "-"
        return "%.3f -> %.3f (%s)" % (
            losses[0], losses[-1],
            "falls" if losses[-1] < losses[0] else "does not fall")

    def ratio(a, b):
        return "%.2fx" % (a / b) if b > 0 else "-"

    if 1 in worker_counts:
        print("| model | batch | steps | pstrain (samples/s) | PyTorch "
              "(samples/s) | ratio | pstrain loss first -> last | PyTorch "
              "loss first -> last | ok |")
        print("|---|---:|---:|---:|---:|---:|---|---|---|")
    for model in args.models.split(",") if 1 in worker_counts else []:
        ps_rate, ps_losses, _, rc = run_pstrain(args, model)
        torch_rate, torch_losses = run_torch(args, model)
        print("| %s | %d | %d | %.1f | %.1f | %.2fx | %s | %s | %s |" % (
            model, args.batch_size, args.steps, ps_rate, torch_rate,
            ps_rate / torch_rate if torch_rate > 0 else 0.0,
            trend(ps_losses), trend(torch_losses),
            "yes" if rc == 0 else "NO (%d)" % rc), flush=True)
    multi = [w for w in worker_counts if w > 1]
    if not multi:
        return
    print("\n| model | workers | batch/worker | steps | pstrain PS sync "
          "(samples/s) | pstrain allreduce (samples/s) | PyTorch DDP "
          "(samples/s) | PS / DDP | allreduce / DDP | loss first -> last: "
          "PS; allreduce; DDP | ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for model in args.models.split(","):
        for w in multi:
            ps_rate, ps_losses, _, ps_rc = run_pstrain(args, model, "sync", w)
            ar_rate, ar_losses, _, ar_rc = run_pstrain(args, model,
                                                       "allreduce", w)
            ddp_rate, ddp_losses = run_ddp(args, model, w)
            print("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %s | %s | "
                  "%s; %s; %s | %s |" % (
                      model, w, args.batch_size, args.steps, ps_rate,
                      ar_rate, ddp_rate, ratio(ps_rate, ddp_rate),
                      ratio(ar_rate, ddp_rate), trend(ps_losses),
                      trend(ar_losses), trend(ddp_losses),
                      "yes" if ps_rc == 0 and ar_rc == 0 else
                      "NO (%d, %d)" % (ps_rc, ar_rc)), flush=True)


if __name__ == "__main__":
    main()
