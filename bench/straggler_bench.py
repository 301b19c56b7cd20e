#!/usr/bin/env python3
"""Stragglers benchmark (issue 25): how each training mode copes with one slow
or stopped worker.

Runs `pstrain run` (LeNet-5 on Fashion-MNIST, short runs sized for a small
machine) for every mode in --modes and every scenario in --scenarios, and
prints one table:

  mode       sync, sync with --staleness=1/2/4 ("stale1", ...), sync with
             --backup_workers=1 ("backup1": each step aggregates the first
             W-1 workers), async, allreduce (Gloo)
  scenario   none: no straggler;
             delay1x / delay3x: the last worker sleeps 1x / 3x the normal
               step time at the start of every step (--straggler=W:MS; the
               normal step time is sync's worker-0 runtime / steps of the
               "none" run, measured first);
             stopN: the last worker is stopped (SIGSTOP) for N seconds, 1 s
               after worker 0's first training log line, then continued
               (SIGCONT).

Columns: train time (s): from worker 0's first step (its "steps per epoch"
line) to the end of the last worker's training (the exit of workers 1..W-1,
which do not evaluate, and worker 0's "Epoch 0 in" line less its test
time), so process start-up and evaluation are left out; with backup
workers, to worker 0's end alone (the model is complete then: the last
step is decided, and the job ends with worker 0 without waiting for a
straggler); job: `pstrain run`'s wall time, start-up, evaluation and the
wait for every process to leave included; throughput = all
workers' samples / train time (samples/s; backup workers: the samples
trained on, (W - b) x batch per step, since a late worker's batch is
dropped), its ratio to the same mode's "none" run; worker 0's final test accuracy; the exit status. Every worker runs the same number of steps,
so a mode can only be faster than its slowest worker where that worker's
steps overlap the others' (see BENCHMARKS.md).

Usage (from the repository root, after `bazel build //cli:pstrain
//worker:pstrain_worker //server:pstrain_ps`):
  /usr/bin/python3 bench/straggler_bench.py --steps=120
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROW = re.compile(r"^\|\s*\d*\s*\|\s*(\d+)\s*\|\s*(\w+)\s*\|.*\|\s*([\d.]+) s\s*\|"
                 r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*$")


def worker_pid(parent_pid, index, deadline_s=60.0):
    """The pid of `pstrain_worker --task_index=index` started by parent_pid."""
    end = time.time() + deadline_s
    needle = "--task_index=%d" % index
    while time.time() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != parent_pid:
                    continue
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    args = f.read().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if any(a.endswith(b"pstrain_worker") for a in args) and \
                    needle.encode() in args:
                return int(entry)
        time.sleep(0.1)
    raise RuntimeError("worker %d of pstrain run %d did not start within %.0f s"
                       % (index, parent_pid, deadline_s))


def exit_time(pid):
    """Now if `pid` has exited (gone or a zombie), else None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return time.time()
    return time.time() if state in ("Z", "X") else None


def run(args, mode, scenario, delay_ms):
    cmd = [args.pstrain, "run", "--model=lenet5",
           "--num_workers=%d" % args.workers, "--epochs=1",
           "--max_steps_per_epoch=%d" % args.steps,
           "--batch_size=%d" % args.batch_size,
           "--log_every_steps=%d" % args.steps]
    if mode == "allreduce":
        cmd.append("--mode=allreduce")
    elif mode == "async":
        cmd += ["--mode=async", "--num_ps=1"]
    else:
        cmd += ["--mode=sync", "--num_ps=1"]
        if mode.startswith("stale"):
            cmd.append("--staleness=%d" % int(mode[len("stale"):]))
        if mode.startswith("backup"):
            cmd.append("--backup_workers=%d" % int(mode[len("backup"):]))
    slow = args.workers - 1
    if scenario.startswith("delay"):
        cmd.append("--straggler=%d:%d" % (slow, delay_ms))
    start = time.time()
    backup = mode.startswith("backup")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []  # (arrival time, line)
    exits = {}

    def watch_exits():
        pids = [worker_pid(proc.pid, i) for i in range(1, args.workers)]
        while len(exits) < len(pids):
            for pid in pids:
                if pid not in exits:
                    t = exit_time(pid)
                    if t is not None:
                        exits[pid] = t
            time.sleep(0.02)
    watcher = threading.Thread(target=watch_exits, daemon=True)
    watcher.start()
    stopper = None
    if args.ps_binary:
        cmd.append("--ps_binary=" + args.ps_binary)
    if args.worker_binary:
        cmd.append("--worker_binary=" + args.worker_binary)
    if scenario.startswith("stop"):
        stop_s = float(scenario[len("stop"):])
        def stop_later():
            pid = worker_pid(proc.pid, slow)
            # Wait for its first step (the model line is logged before it).
            end = time.time() + 120
            while time.time() < end and not any(
                    "steps per epoch per worker" in l for _, l in lines):
                time.sleep(0.05)
            time.sleep(1.0)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_s)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # the job ended without it (backup workers)
        stopper = threading.Thread(target=stop_later, daemon=True)
        stopper.start()
    for line in proc.stdout:
        lines.append((time.time(), line))
    proc.wait()
    job_s = time.time() - start
    if stopper is not None:
        stopper.join(timeout=1)
    watcher.join(timeout=2)
    result = {"rc": proc.returncode, "train": float("nan"), "job": job_s,
              "runtime0": float("nan"), "acc": float("nan")}
    first = None
    end = max(exits.values()) if len(exits) == args.workers - 1 else None
    if backup:
        end = 0.0
    for t, line in lines:
        if first is None and "steps per epoch per worker" in line:
            first = t
        m = re.search(r"Epoch 0 in [\d.]+ sec, test time ([\d.]+) sec", line)
        if m and end is not None:
            end = max(end, t - float(m.group(1)))
        m = ROW.match(line.strip())
        if m:
            result["runtime0"] = float(m.group(3))
            result["acc"] = float(m.group(5))
    if first is not None and end is not None:
        result["train"] = end - first
    if proc.returncode != 0:
        sys.stderr.write("".join(l for _, l in lines[-15:]))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pstrain", default="bazel-bin/cli/pstrain")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=120,
                   help="steps per worker")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--ps_binary", default="",
                   help="passed to pstrain run (a private copy keeps the "
                   "runs apart from rebuilds of bazel-bin)")
    p.add_argument("--worker_binary", default="")
    p.add_argument("--modes",
                   default="sync,backup1,stale1,stale2,stale4,async,"
                   "allreduce")
    p.add_argument("--scenarios",
                   default="none,delay1x,delay3x,stop20,stop8")
    args = p.parse_args()
    modes = args.modes.split(",")
    scenarios = args.scenarios.split(",")
    samples = args.workers * args.steps * args.batch_size

    # The normal step time, from a sync run without a straggler.
    base = run(args, "sync", "none", 0)
    step_ms = base["runtime0"] * 1000.0 / args.steps
    print("# %d workers, 1 shard, LeNet-5, batch %d, %d steps per worker; "
          "normal sync step %.0f ms (worker 0)" %
          (args.workers, args.batch_size, args.steps, step_ms))
    print("# %-9s %-8s %6s %9s %6s %6s %6s %3s" %
          ("mode", "scenario", "train", "thruput", "ratio", "acc", "job",
           "rc"))
    print("# %-9s %-8s %6s %9s %6s %6s %6s %3s" %
          ("", "", "(s)", "(samp/s)", "(none)", "", "(s)", ""))
    sys.stdout.flush()
    for mode in modes:
        none = None
        for scenario in scenarios:
            if mode == "sync" and scenario == "none":
                r = base
            else:
                factor = {"delay1x": 1, "delay3x": 3}.get(scenario, 0)
                r = run(args, mode, scenario, int(round(factor * step_ms)))
            trained = samples
            if mode.startswith("backup"):
                trained = (samples // args.workers *
                           (args.workers - int(mode[len("backup"):])))
            thruput = trained / r["train"]
            if scenario == "none":
                none = thruput
            ratio = thruput / none if none else float("nan")
            print("  %-9s %-8s %6.1f %9.0f %6.2f %6.4f %6.1f %3d" %
                  (mode, scenario, r["train"], thruput, ratio, r["acc"],
                   r["job"], r["rc"]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
