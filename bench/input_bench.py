#!/usr/bin/env python3
"""Input pipeline images/sec: pstrain's worker/input_pipeline (input_bench)
against PyTorch's DataLoader on the same JPEG files, the same transforms and
the same number of threads, in one run; prints a table.

Both sides read each file, decode it (libjpeg-turbo: pstrain directly, PIL
through its own libjpeg-turbo build), apply RandomResizedCrop(size) (scale
(0.08, 1), ratio (3/4, 4/3)), a horizontal flip with probability 1/2,
ToTensor and ImageNet's Normalize, and stack batches of 64. torchvision is
not installed here, so the PyTorch side does torchvision's steps by hand:
RandomResizedCrop.get_params' algorithm with torch's generator, then
img.crop(box).resize(size, BILINEAR) as torchvision's F.resized_crop does
on PIL images (PIL's resize filters over the whole source window when it
shrinks; pstrain's bilinear takes the 4 nearest pixels, as
F.interpolate(antialias=False)), transpose(FLIP_LEFT_RIGHT), then
torch.from_numpy(...).permute(2, 0, 1).float().div(255) and
(x - mean) / std. DataLoader(num_workers=T, persistent_workers=True) uses T
worker processes; pstrain uses T pipeline threads. Both are timed from the
first batch to the last of --epochs epochs (worker start-up left out).

Correctness column: the first 8 images decoded without crop or flip, as
pstrain's pipeline gives them (at the files' own size, so no resize)
against PIL's decode: the largest difference in 8-bit levels, and how many
values differ by more than one level (#wrong).

--source=224:448 makes the 224-pixel rows' files 448x448, as ImageNet's
photos are larger than the crop: RandomResizedCrop then shrinks, and
pstrain decodes only each crop's window of the file.

  /usr/bin/python3 bench/input_bench.py \
      --input_bench bazel-bin/bench/input_bench --threads 1,2
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_images(folder, count, size, seed):
    """Smooth colour waves plus noise: JPEG-compressible like photos."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(count):
        a = rng.uniform(0, 1, (3, 3))
        planes = [(np.sin(2 * np.pi * (3 * a[c, 0] * xx + 3 * a[c, 1] * yy) +
                          6 * a[c, 2]) * 0.5 + 0.5) * 200 +
                  rng.normal(0, 12, (size, size)) for c in range(3)]
        img = np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(folder, "%06d.jpg" % i),
                                  quality=90)


def resized_crop_params(height, width, scale=(0.08, 1.0),
                        ratio=(3.0 / 4.0, 4.0 / 3.0)):
    """torchvision.transforms.RandomResizedCrop.get_params (0.14)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = math.exp(
            torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class JpegFiles(Dataset):
    def __init__(self, paths, size):
        self.paths = paths
        self.size = size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with open(self.paths[index], "rb") as f:
            img = Image.open(f).convert("RGB")
        i, j, h, w = resized_crop_params(img.height, img.width)
        img = img.crop((j, i, j + w, i + h)).resize((self.size, self.size),
                                                     Image.BILINEAR)
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())
        x = x.permute(2, 0, 1).float().div(255)
        return (x - MEAN) / STD, 0


def torch_images_per_sec(paths, size, threads, batch_size, epochs):
    torch.manual_seed(1)
    loader = DataLoader(JpegFiles(paths, size), batch_size=batch_size,
                        shuffle=True, drop_last=True, num_workers=threads,
                        persistent_workers=True,
                        generator=torch.Generator().manual_seed(1))
    images = 0
    start = None
    checksum = 0.0
    for _ in range(epochs):
        for x, _ in loader:
            if start is None:
                start = time.perf_counter()
            else:
                images += x.shape[0]
            checksum += float(x[0, 0, 0, 0])
    seconds = time.perf_counter() - start
    return images / seconds, images, seconds


def pstrain_run(binary, folder, size, threads, batch_size, epochs, reference,
                source):
    out = subprocess.run(
        [binary, "--dir=" + folder, "--size=%d" % size,
         "--threads=%d" % threads, "--batch_size=%d" % batch_size,
         "--epochs=%d" % epochs, "--reference_out=" + reference,
         "--reference_size=%d" % source],
        check=True, capture_output=True, text=True).stdout
    fields = dict(kv.split("=") for kv in out.split())
    return float(fields["images_per_sec"]), int(fields["images"]), float(
        fields["seconds"])


def check_decode(paths, size, reference):
    ours = np.fromfile(reference, dtype=np.float32).reshape(-1, 3, size, size)
    worst, wrong = 0.0, 0
    for k in range(ours.shape[0]):
        with open(paths[k], "rb") as f:
            pil = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32)
        pil = pil.transpose(2, 0, 1) / 255.0
        diff = np.abs(ours[k] - pil) * 255.0
        worst = max(worst, float(diff.max()))
        wrong += int((diff > 1.0 + 1e-3).sum())
    return worst, wrong


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input_bench", default="bazel-bin/bench/input_bench")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--sizes", default="64,224")
    parser.add_argument("--images", default="64:1024,224:256",
                        help="size:count of JPEG files made per size")
    parser.add_argument("--source", default="",
                        help="size:source_size: files of source_size x "
                             "source_size pixels for that output size "
                             "(default: the output size), e.g. 224:448 for "
                             "ImageNet-sized photos")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    counts = dict(tuple(int(v) for v in kv.split(":"))
                  for kv in args.images.split(","))
    sources = dict(tuple(int(v) for v in kv.split(":"))
                   for kv in args.source.split(",") if kv)
    torch.set_num_threads(1)
    print("# input pipeline: read + decode + RandomResizedCrop + flip + "
          "normalize + batch of %d, %d epochs" % (args.batch_size, args.epochs))
    print("%6s %7s %7s %7s %12s %12s %7s %9s %6s" %
          ("# size", "source", "threads", "images", "pstrain", "pytorch",
           "ratio", "max_diff", "#wrong"))
    print("%6s %7s %7s %7s %12s %12s %7s %9s %6s" %
          ("# (px)", "(px)", "(#)", "(#)", "(images/s)", "(images/s)", "(x)",
           "(levels)", ""))
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            folder = os.path.join(tmp, "jpeg%d" % size)
            os.makedirs(folder)
            source = sources.get(size, size)
            make_images(folder, counts.get(size, 256), source, seed=size)
            paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
            reference = os.path.join(tmp, "reference%d.f32" % size)
            for threads in (int(t) for t in args.threads.split(",")):
                ours, _, _ = pstrain_run(args.input_bench, folder, size,
                                         threads, args.batch_size,
                                         args.epochs, reference, source)
                theirs, _, _ = torch_images_per_sec(paths, size, threads,
                                                    args.batch_size,
                                                    args.epochs)
                worst, wrong = check_decode(paths, source, reference)
                print("%6d %7d %7d %7d %12.1f %12.1f %7.2f %9.2f %6d" %
                      (size, source, threads, len(paths), ours, theirs,
                       ours / theirs, worst, wrong))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
