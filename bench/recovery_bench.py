#!/usr/bin/env python3
"""Recovery time after a PS shard is killed (issue 20).

For each model: `pstrain run` (2 shards, 2 sync workers, a checkpoint every
--checkpoint_every steps) is started; once a checkpoint is durable, shard 1
is killed with SIGKILL. Measured from the kill:
  - "back to training": until worker 0 prints its first step line after
    both workers' "recovered" lines (the supervisor restarts the shard,
    worker 0 restores every shard to the newest checkpoint, the workers
    pull and go on);
  - the workers' own "recovered in X s" (from their noticing the failure);
and, as the baseline measured in the same run, what peers do when a PS
dies (TensorFlow's PS training restarts the cluster from its checkpoint):
`pstrain run --resume` of a copy of the same checkpoint, from launch until
its first step line. The correctness column: the killed run finished with
exit 0 and its final test accuracy.

Usage: python3 bench/recovery_bench.py [--repeats=3] [--models=lenet5,resnet18]
Needs `bazel build //cli:pstrain //server:pstrain_ps //worker:pstrain_worker`.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PSTRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                       "bazel-bin", "cli", "pstrain")


class Run:
    """A pstrain run whose output lines are timestamped as they come."""

    def __init__(self, argv):
        self.lines = []  # (time, line)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern, after=0.0, timeout=600):
        """Time of the first line matching `pattern` at or after `after`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t, line in self.lines:
                    if t >= after and regex.search(line):
                        return t, line
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        raise RuntimeError("no line matching %r; output:\n%s" %
                           (pattern, self.text()[-4000:]))

    def text(self):
        with self.lock:
            return "\n".join(line for _, line in self.lines)


def child_pid(parent, pattern):
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", pattern],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def dir_mb(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total / 1e6


def one_repeat(model, steps, every, work):
    ckpt = os.path.join(work, "ck")
    common = ["--model=" + model, "--num_ps=2", "--num_workers=2",
              "--epochs=1", "--max_steps_per_epoch=%d" % steps,
              "--log_every_steps=1", "--checkpoint_every_steps=%d" % every]
    run = Run([PSTRAIN, "run", "--checkpoint_dir=" + ckpt] + common)
    latest = os.path.join(ckpt, "latest")
    while not os.path.exists(latest):
        if run.proc.poll() is not None:
            raise RuntimeError(run.text()[-4000:])
        time.sleep(0.05)
    step_dir = os.path.join(ckpt, open(latest).read().strip())
    # The baseline's copy of the same checkpoint (the durable one).
    copy = os.path.join(work, "copy")
    os.makedirs(copy)
    shutil.copytree(step_dir, os.path.join(copy, os.path.basename(step_dir)))
    shutil.copy(latest, os.path.join(copy, "latest"))
    size_mb = dir_mb(step_dir)
    pid = child_pid(run.proc.pid, r"pstrain_ps .*--task_index=1")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    t0, _ = run.wait_for(r"\[worker0\] worker 0: recovered in", killed)
    t1, _ = run.wait_for(r"\[worker1\] worker 1: recovered in", killed)
    back, _ = run.wait_for(r"\[worker0\] Step[0-9]+:", max(t0, t1))
    reported = [float(m) for m in re.findall(
        r"worker [01]: recovered in ([0-9.]+) s", run.text())]
    code = run.proc.wait(timeout=1200)
    run.reader.join()
    accuracy = re.findall(r"\| (0\.[0-9]{4}) \|", run.text())
    ok = code == 0 and accuracy
    # Baseline: restart the whole job from the copy.
    launched = time.monotonic()
    cold = Run([PSTRAIN, "run", "--resume", "--checkpoint_dir=" + copy] +
               common)
    first, _ = cold.wait_for(r"\[worker0\] Step[0-9]+:", launched)
    cold.proc.send_signal(signal.SIGINT)
    cold.proc.wait(timeout=60)
    return {
        "mb": size_mb,
        "back": back - killed,
        "reported": max(reported) if reported else float("nan"),
        "cold": first - launched,
        "ok": "exit 0, acc %s" % accuracy[-1] if ok else "FAILED (%d)" % code,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="lenet5,resnet18")
    args = parser.parse_args()
    settings = {"lenet5": (300, 100), "resnet18": (40, 10),
                "resnet50": (30, 10)}
    rows = []
    for model in args.models.split(","):
        steps, every = settings.get(model, (40, 10))
        results = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as work:
                results.append(one_repeat(model, steps, every, work))
        med = lambda k: statistics.median(r[k] for r in results)
        rows.append((model, med("mb"), med("back"), med("reported"),
                     med("cold"), med("cold") / med("back"),
                     "; ".join(sorted(set(r["ok"] for r in results)))))
    print("| model | checkpoint (MB) | kill to training again (s) | "
          "workers' recovery (s) | baseline: whole job restarted from the "
          "checkpoint (s) | baseline / recovery | killed run |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print("| %s | %.1f | %.2f | %.2f | %.2f | %.1fx | %s |" % r)
    print("\nmedians of %d repeats; 2 shards, 2 sync workers, shard 1 "
          "killed with SIGKILL after the first durable checkpoint" %
          args.repeats)


if __name__ == "__main__":
    sys.exit(main())
