#!/usr/bin/env python3
"""Gradient clipping benchmark (issue 25): what clipping by global norm costs
in sync PS mode, where the shards agree on each step's norm through the
workers (one more round trip per step), against the same cost in allreduce
(where every worker holds every gradient, but the optimizer no longer
overlaps the allreduce of later buckets).

For every model in --models, runs `pstrain run` (Fashion-MNIST, --num_ps
shards, --num_workers workers, SGD with momentum 0.9, 1 epoch of --steps
steps) in sync and allreduce mode, each without clipping and with
--clip_grad_norm=--clip, --repeats times, and prints one table:

  throughput   samples/s of the run's result table (the median of the
               repeats; all workers' samples over worker 0's training
               time, evaluation left out)
  step         ms per step at that throughput
  vs unclipped the ratio to the same mode's unclipped median (the baseline,
               measured in the same run)
  accuracy     worker 0's test accuracy after the run (median run), the
               correctness column: clipping at a threshold above the
               gradients' usual norm must not lose accuracy
  ok           every repeat exited 0

Usage (from the repository root, after `bazel build //cli:pstrain
//worker:pstrain_worker //server:pstrain_ps`):
  /usr/bin/python3 bench/clip_bench.py --models=lenet5,resnet18
"""

import argparse
import re
import statistics
import subprocess
import sys

# | #PS | #Workers | Mode | Model | Batchsize | Epochs | Steps | Runtime |
#   Throughput | Test accuracy |
ROW = re.compile(r"^\|\s*\d*\s*\|\s*\d+\s*\|\s*(\w+)\s*\|\s*(\w+)\s*\|.*\|"
                 r"\s*([\d.]+) s\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*$")


def run(args, model, mode, clip):
    """(throughput samples/s, test accuracy, exit status) of one run."""
    cmd = [args.pstrain, "run", "--model=" + model, "--mode=" + mode,
           "--num_workers=%d" % args.num_workers, "--epochs=1",
           "--max_steps_per_epoch=%d" % args.steps,
           "--batch_size=%d" % args.batch_size, "--optimizer=sgd",
           "--lr=%g" % args.lr, "--momentum=0.9",
           "--clip_grad_norm=%g" % clip]
    if mode != "allreduce":
        cmd.append("--num_ps=%d" % args.num_ps)
        if args.ps_binary:
            cmd.append("--ps_binary=" + args.ps_binary)
    if args.worker_binary:
        cmd.append("--worker_binary=" + args.worker_binary)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout_s)
    for line in proc.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            return float(m.group(4)), float(m.group(5)), proc.returncode
    sys.stderr.write("no result row in:\n" + proc.stdout[-2000:] + "\n")
    return 0.0, 0.0, proc.returncode or 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="lenet5,resnet18")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--num_ps", type=int, default=2)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout_s", type=int, default=1800)
    p.add_argument("--pstrain", default="bazel-bin/cli/pstrain")
    p.add_argument("--ps_binary", default="")
    p.add_argument("--worker_binary", default="")
    args = p.parse_args()

    print("| model | mode | clip_grad_norm | throughput (samples/s) | "
          "step (ms) | vs unclipped | test accuracy | ok |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for model in args.models.split(","):
        for mode in ("sync", "allreduce"):
            baseline = None
            for clip in (0.0, args.clip):
                runs = [run(args, model, mode, clip)
                        for _ in range(args.repeats)]
                runs.sort(key=lambda r: r[0])
                median = runs[len(runs) // 2]
                throughput = statistics.median(r[0] for r in runs)
                if baseline is None:
                    baseline = throughput
                step_ms = (1000.0 * args.batch_size * args.num_workers /
                           throughput if throughput > 0 else 0.0)
                ok = all(r[2] == 0 for r in runs)
                print("| %s | %s | %g | %.1f | %.1f | %.3f | %.4f | %s |" %
                      (model, mode, clip, throughput, step_ms,
                       throughput / baseline if baseline else 0.0,
                       median[1], "yes" if ok else "NO"),
                      flush=True)


if __name__ == "__main__":
    main()
