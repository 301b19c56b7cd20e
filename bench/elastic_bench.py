#!/usr/bin/env python3
"""Time from a scale request to training again (issue 40), workers and shards.

For each model and kind (--kinds), two elastic `pstrain run`s (sync,
--control_file, a checkpoint every --checkpoint_every_steps, log line every
step, one job at a time so that its processes share the 2 cores as `pstrain
run` assigns their threads):
  - workers (2 shards, --max_workers=3): grow, 2 workers; once the first
    checkpoint is durable and worker 0 trains on, `num_workers=3` is
    appended to the control file; shrink, 3 workers, `num_workers=2`;
  - shards (2 workers, --max_ps=3): grow, 2 shards, `num_ps=3`; shrink,
    3 shards, `num_ps=2` (worker 0 moves the state in memory onto the new
    layout at a step boundary; the other workers' step fails and they
    recover onto it; a removed shard exits).
Measured from the append (time.monotonic() of each output line as it
comes):
  - "request to every member in the new step": until the latest of worker
    0's `membership E: A -> B workers[, P -> Q shards] at step S (T ms)`
    line and the other workers' "recovered", "rejoined" or "membership E,"
    lines before worker 0's next Step line (each starts the step at the
    new count then);
  - "request to the new count's first step done": until worker 0's first
    Step line after its membership line (a step line comes at the end of
    its step, so this holds one whole step at the new count, and the wait
    for the step boundary in flight at the request);
  - "worker 0's T": the time worker 0 reports for the change itself (from
    the boundary at which it applies the membership until the shards
    reopened with it; for shards, the export from the old shards and the
    restore onto the new ones in it; a change of workers in plain sync
    mode is planned for the decision of the step in flight, and T runs
    from the plan to that decision);
  - "to the boundary": request to the membership line less T (when worker
    0 began the change, or planned it: the control file's poll, the
    coordinator's Scale, worker 0 learning of it, the step in flight);
  - "others' recovery": the longest "recovered in X s" the other workers
    report for the change (their failed step's retries onto the new
    layout included);
  - "stall": the gap between worker 0's last Step line before the
    membership line and its first after it, against the median gap between
    step lines before the request (the step time);
  - grow only, the joining member's start: for workers, from its "worker 2
    of job-" line (its process started) to its "worker 2 rejoined the job"
    line (it loaded the dataset, built the model, registered and pulled):
    training goes on at 2 workers meanwhile, and the coordinator makes the
    new membership ready only once the worker has registered; for shards,
    from its "ps 2 of job-" line to its "shard 2/3 of job-1 listening" line
    and to worker 0's membership line.
Baseline, measured in the same run: what a job without elasticity does,
stop and restart from a checkpoint with the new count: `pstrain run
--resume --num_workers=N` of a copy of the elastic run's first checkpoint
after the change (so at the new count: `pstrain run` refuses to resume a
checkpoint saved at another worker count before anything starts, in
cli/local_job.cc, though the workers' data position could re-split it);
for shards `--resume --num_ps=N` of a copy of the checkpoint before the
change (checkpoints load into any number of shards); from launch until
worker 0's first Step line; it trains to the end too.
Correctness columns: each run's exit code and final test accuracy.
LeNet-5 trains Fashion-MNIST; ResNet-18 synthetic 3 x 28 x 28 images of
10 classes (evaluating
Fashion-MNIST's 10,000 test images takes ~160 s on 2 cores, the synthetic
set's 1,000 a tenth of it), so its accuracies are only compared with each
other.

With --mode=async every run (the baseline too) is async: worker 0 reopens
the shards at their own state (or moves each chunk as it is) from its step,
and every member follows from its own place (docs/ARCHITECTURE.md, "Async").

With --mode=allreduce (workers only) every run (the baseline too) is an
allreduce job: the workers agree at a step boundary and connect the new
world's collective, rank 0 sending its state when a worker joins
(docs/ARCHITECTURE.md, "Allreduce"); the others' lines "worker N:
membership E, ..." say they are in it, and the joining worker's "start to
ready" runs until that line (it joins no shards before the change).

With --staleness=S every run (the baseline too) has bounded staleness S:
worker 0 first waits until every shard has decided its last step, then
reopens them or moves their state; the others' steps run ahead are redone
in the new generation (docs/ARCHITECTURE.md, "Applying").

With --standby (workers, grow only) the elastic run has
--standby_workers: worker 2 starts with the job, builds its model and
waits prepared; the request follows its "standing by" line, and a grow
takes it with no process start (its "start" is then before the request:
negative).

With --backup_workers=B every run (the baseline too) has B backup workers:
worker 0 first has shard 0 hold its first undecided step's admissions and
waits until every shard has decided the step before it
(PsClient::HoldAndSettle), then reopens them or moves their state.

Usage: python3 bench/elastic_bench.py [--repeats=3] [--models=lenet5,resnet18]
                                      [--kinds=workers,shards] [--staleness=0]
                                      [--backup_workers=0] [--standby]
                                      [--mode=sync|async|allreduce]
Needs `bazel build //cli:pstrain //server:pstrain_ps //worker:pstrain_worker`
and Fashion-MNIST.
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

STEP = r"\[worker0\] Step[0-9]+:"
RESUMED = (r"\[worker[0-9]+\] worker [0-9]+(: recovered in| rejoined the job"
           r"|: membership [0-9]+, )")
RECOVERED = r"\[worker[0-9]+\] worker [0-9]+: recovered in ([0-9.]+) s"


class Change:
    """One scale request: `kind` ("workers" or "shards") from `old` to
    `new`; what differs between the two kinds."""

    def __init__(self, kind, old, new, allreduce=False):
        self.kind, self.old, self.new = kind, old, new
        workers = kind == "workers"
        # The elastic run's counts and limit, and the baseline's counts.
        if allreduce:
            self.flags = ["--num_workers=%d" % old, "--mode=allreduce",
                          "--max_workers=3"]
            self.resume = ["--num_workers=%d" % new, "--mode=allreduce"]
        elif workers:
            self.flags = ["--num_workers=%d" % old, "--num_ps=2",
                          "--max_workers=3"]
            self.resume = ["--num_workers=%d" % new, "--num_ps=2"]
        else:
            self.flags = ["--num_workers=2", "--num_ps=%d" % old,
                          "--max_ps=3"]
            self.resume = ["--num_workers=2", "--num_ps=%d" % new]
        self.request = "%s=%d\n" % ("num_workers" if workers else "num_ps",
                                     new)
        counts = ("%d -> %d workers" % (old, new) if workers else
                  "2 -> 2 workers, %d -> %d shards" % (old, new))
        self.membership = (r"\[worker0\] membership [0-9]+: %s at step "
                           r"([0-9]+) \(([0-9]+) ms\)" % counts)
        # The joining member (grow): its process's first line and the
        # line once it is ready (index `old`: the new one).
        self.joiner = None
        if new > old and workers:
            # Allreduce: ready is in the new world (it joins no shards
            # before).
            self.joiner = (r"\[worker%d\] worker %d of job-" % (old, old),
                           (r"\[worker%d\] worker %d: membership [0-9]+, "
                            % (old, old)) if allreduce else
                           r"\[worker%d\] worker %d rejoined the job at step"
                           % (old, old))
        elif new > old:
            self.joiner = (r"\[ps%d\] ps %d of job-" % (old, old),
                           r"\[ps%d\] shard %d/[0-9]+ of \S+ listening"
                           % (old, old))

        # The removed shard (shrink): its last line.
        self.leaver = None
        if new < old and not workers:
            self.leaver = (r"\[ps%d\] shard %d left the job's layout" %
                           (new, new))

    def label(self):
        return "%d -> %d %s" % (self.old, self.new, self.kind)

    def name(self):
        return "%s-%d-%d" % (self.kind, self.old, self.new)


class Run:
    """A pstrain run whose output lines are timestamped as they come."""

    def __init__(self, argv):
        self.lines = []  # (time, line)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern, after=0.0, timeout=600):
        """(time, match) of the first line matching `pattern` at or after
        `after`."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t, line in self.lines:
                    if t >= after:
                        m = regex.search(line)
                        if m:
                            return t, m
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("no line matching %r; output:\n%s" %
                           (pattern, self.text()[-4000:]))

    def times(self, pattern, before=float("inf"), after=0.0):
        regex = re.compile(pattern)
        with self.lock:
            return [t for t, line in self.lines
                    if after <= t < before and regex.search(line)]

    def finish(self, timeout=1200):
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError("timed out; output:\n" + self.text()[-4000:])
        self.reader.join()
        return code

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def text(self):
        with self.lock:
            return "\n".join(line for _, line in self.lines)

    def stamped(self, origin):
        """The output, each line after its time in s since `origin`."""
        with self.lock:
            return "".join("%9.3f %s\n" % (t - origin, line)
                           for t, line in self.lines)

    def text_between(self, after, before):
        with self.lock:
            return "\n".join(line for t, line in self.lines
                             if after <= t < before)

    def accuracy(self):
        found = re.findall(r"test accuracy: (0\.[0-9]{4})", self.text())
        return found[-1] if found else None


def outcome(code, accuracy):
    if code == 0 and accuracy:
        return "exit 0, acc %s" % accuracy
    return "FAILED (exit %d)" % code


def wait_checkpoint(run, ckpt, after_step):
    """The newest checkpoint's folder name once its step is > after_step."""
    latest = os.path.join(ckpt, "latest")
    while True:
        if os.path.exists(latest):
            name = open(latest).read().strip()
            if int(name.split("-")[-1]) > after_step:
                return name
        if run.proc.poll() is not None:
            raise RuntimeError("no checkpoint after step %d; output:\n%s" %
                               (after_step, run.text()[-4000:]))
        time.sleep(0.02)


def copy_checkpoint(name, ckpt, copy):
    os.makedirs(copy)
    shutil.copytree(os.path.join(ckpt, name), os.path.join(copy, name))
    with open(os.path.join(copy, "latest"), "w") as f:
        f.write(name + "\n")


def one_repeat(model, cfg, change, work, log_dir, args):
    ctl = os.path.join(work, "ctl")
    open(ctl, "w").close()
    ckpt = os.path.join(work, "ck")
    common = ["--model=" + model] + cfg["data"] + [
              "--epochs=1", "--max_steps_per_epoch=%d" % cfg["steps"],
              "--batch_size=%d" % cfg["batch"], "--seed=1",
              "--log_every_steps=1",
              "--checkpoint_every_steps=%d" % cfg["every"]]
    if args.staleness > 0:
        common.append("--staleness=%d" % args.staleness)
    if args.backup_workers > 0:
        common.append("--backup_workers=%d" % args.backup_workers)
    if args.mode == "async":
        common.append("--mode=async")
    runs = []
    try:
        return measure(model, change, work, log_dir, ctl, ckpt, common,
                       runs, args.standby)
    finally:
        for r in runs:
            r.stop()


def measure(model, change, work, log_dir, ctl, ckpt, common, runs,
            standby=False):
    run = Run([PSTRAIN, "run", "--checkpoint_dir=" + ckpt,
               "--control_file=" + ctl] + change.flags + common +
              (["--standby_workers"] if standby else []))
    runs.append(run)
    # The request follows the first durable checkpoint.
    first_ckpt = wait_checkpoint(run, ckpt, 0)
    copy = os.path.join(work, "copy")
    if change.kind == "shards":
        # The shards' baseline resumes the checkpoint before the change
        # (it loads into any number of shards): one written after a shard
        # change failed to resume ("PS tensor 1 has elements from 0 of 64
        # in no shard file"), ResNet-18, 2026-11-27.
        copy_checkpoint(first_ckpt, ckpt, copy)
    if standby:
        run.wait_for(r"\[worker%d\] worker %d: prepared; standing by" %
                     (change.old, change.old))
    run.wait_for(STEP, time.monotonic())
    requested = time.monotonic()
    with open(ctl, "a") as f:
        f.write(change.request)
    t_member, m = run.wait_for(change.membership, requested)
    applied_at, reported_ms = int(m.group(1)), float(m.group(2))
    back, _ = run.wait_for(STEP, t_member)
    if change.kind == "workers":
        # The baseline's checkpoint: the first durable one at the new count.
        copy_checkpoint(wait_checkpoint(run, ckpt, applied_at), ckpt, copy)
    before = run.times(STEP, before=t_member)
    steady = run.times(STEP, before=requested)[-21:]
    step_s = statistics.median(b - a for a, b in zip(steady, steady[1:]))
    # Every member back in the step after the change: the membership line,
    # and the other workers' recovery or a joining worker's rejoin (before
    # worker 0's first step line at the new count; the step starts then).
    joined = run.times(RESUMED, before=back, after=requested)
    recovered = [float(x) for x in
                 re.findall(RECOVERED, run.text_between(requested, back))]
    result = {
        "to_training": back - requested,
        "members_back": max([t_member] + joined) - requested,
        "reported_ms": reported_ms,
        "to_boundary": t_member - requested - reported_ms / 1000,
        "recovery": max(recovered) if recovered else 0.0,
        "stall": back - before[-1],
        "step": step_s,
        "applied_at": applied_at,
    }
    if change.joiner:
        # A standby started with the job.
        started, _ = run.wait_for(change.joiner[0],
                                  0.0 if standby else requested)
        ready, _ = run.wait_for(change.joiner[1], requested)
        result["joiner_start"] = started - requested
        result["joiner_load"] = ready - started
        result["joiner_member"] = t_member - started
    code = run.finish()
    result["elastic"] = outcome(code, run.accuracy())
    if change.leaver:
        left = run.times(change.leaver, after=requested)
        result["leaver_exit"] = left[0] - requested if left else float("nan")
    # The step time at the new count: worker 0's step lines after `back`
    # (the last one of the epoch excepted).
    after = run.times(STEP, after=back)[:21]
    result["step_after"] = statistics.median(
        b - a for a, b in zip(after, after[1:]))
    # What the change cost beyond a step: the stall less a new step.
    result["lost"] = result["stall"] - result["step_after"]
    with open(os.path.join(log_dir, "%s-%s-elastic.log" %
                           (model, change.name())), "w") as f:
        f.write(run.stamped(requested))
    # Baseline: the job restarted from the copy with the new count.
    launched = time.monotonic()
    cold = Run([PSTRAIN, "run", "--resume", "--checkpoint_dir=" + copy] +
               change.resume + common)
    runs.append(cold)
    first, _ = cold.wait_for(STEP, launched)
    code = cold.finish()
    with open(os.path.join(log_dir, "%s-%s-resumed.log" %
                           (model, change.name())), "w") as f:
        f.write(cold.stamped(launched))
    result["cold"] = first - launched
    result["resumed"] = outcome(code, cold.accuracy())
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="lenet5,resnet18")
    parser.add_argument("--kinds", default="workers,shards",
                        help="what to scale: workers, shards or both")
    parser.add_argument("--staleness", type=int, default=0,
                        help="bounded staleness of every run (0: none)")
    parser.add_argument("--backup_workers", type=int, default=0,
                        help="backup workers of every run (0: none; at most "
                        "1: the runs have 2 workers at their smallest)")
    parser.add_argument("--mode", default="sync",
                        choices=["sync", "async", "allreduce"],
                        help="every run's mode (allreduce: workers only)")
    parser.add_argument("--standby", action="store_true",
                        help="workers, grow only: the elastic run has "
                        "--standby_workers (worker 2 waits prepared)")
    parser.add_argument("--log_dir", default="",
                        help="keep every run's output here (default: none)")
    args = parser.parse_args()
    if args.mode == "async" and (args.staleness > 0 or args.backup_workers):
        parser.error("--staleness or --backup_workers with --mode=async: "
                     "they shape sync steps")
    if args.mode == "allreduce" and (args.staleness > 0 or
                                     args.backup_workers or
                                     args.kinds != "workers"):
        parser.error("--mode=allreduce: only --kinds=workers, without "
                     "--staleness or --backup_workers (no shards)")
    if args.standby and args.kinds != "workers":
        parser.error("--standby: only --kinds=workers (standby workers; the "
                     "grow only)")
    if not 0 <= args.backup_workers <= 1:
        parser.error("--backup_workers=%d: expected 0 or 1 (the runs have 2 "
                     "workers at their smallest)" % args.backup_workers)
    # steps: per epoch (the run's length); every: checkpoint interval (the
    # request follows the first); batch: per worker.
    # ResNet-18 trains synthetic 3 x 28 x 28 images of 10 classes: evaluating
    # Fashion-MNIST's 10,000 test images takes ~160 s on 2 cores, the
    # synthetic set's 1,000 a tenth of it.
    settings = {
        "lenet5": {"steps": 600, "every": 100, "batch": 64,
                   "data": ["--dataset=fashion_mnist"]},
        "resnet18": {"steps": 25, "every": 5, "batch": 16,
                     "data": ["--dataset=synthetic", "--image_size=28",
                              "--num_classes=10",
                              "--synthetic_samples=2048"]}}
    rows = []
    began = time.monotonic()
    for model in args.models.split(","):
        cfg = settings.get(model, settings["resnet18"])
        for kind in args.kinds.split(","):
            for old, new in ((2, 3),) if args.standby else ((2, 3), (3, 2)):
                rows.append(one_row(model, cfg,
                                    Change(kind, old, new,
                                           args.mode == "allreduce"),
                                    args))
    print("| model | change | request to every member in the new step (s) "
          "| request to the new count's first step done (s) | "
          "worker 0's change (ms) | request to the boundary: membership line "
          "- worker 0's change (s) | other workers' recovery, as reported "
          "(s) | stall: step gap across it (s) | "
          "step before (s) | step after (s) | lost: stall - step after (s) "
          "| joining member: request to start + start to ready "
          "(s) | baseline: restart from the checkpoint to its first "
          "step (s) | elastic / baseline | elastic run | resumed run |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---:|---|---|")
    for r in rows:
        print("| %s | %s | %.2f | %.2f | %.0f | %.2f | %.2f | %.2f | %.2f "
              "| %.2f | %.2f | %s | %.2f | %.2fx | %s | %s |" % r)
    print("\nmedians of %d repeats; %s%s%s%s; %s; %.0f s in all" %
          (args.repeats, args.mode, ", staleness %d" % args.staleness
           if args.staleness else "",
           ", standby workers" if args.standby else "",
           ", %d backup worker" % args.backup_workers
           if args.backup_workers else "",
           "workers: no shards, --max_workers=3" if args.mode == "allreduce"
           else "workers: 2 shards, --max_workers=3; shards: 2 workers, "
           "--max_ps=3", time.monotonic() - began))


def one_row(model, cfg, change, args):
    """The table row of `change`: medians of args.repeats runs."""
    results = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as work:
            log_dir = args.log_dir or work
            if args.log_dir:
                log_dir = os.path.join(args.log_dir, str(i))
                os.makedirs(log_dir, exist_ok=True)
            r = one_repeat(model, cfg, change, work, log_dir, args)
        results.append(r)
        print("# %s %s, repeat %d: %s" % (model, change.label(), i,
              {k: (round(v, 3) if isinstance(v, float) else v)
               for k, v in r.items()}), flush=True)

    def med(key):
        return statistics.median(r[key] for r in results)

    joiner = "-"
    if change.joiner and change.kind == "workers":
        joiner = "%.2f + %.2f" % (med("joiner_start"), med("joiner_load"))
    elif change.joiner:
        joiner = "%.2f + %.2f (membership at start + %.2f)" % (
            med("joiner_start"), med("joiner_load"), med("joiner_member"))
    elif "leaver_exit" in results[0]:
        joiner = "- (the removed shard exits at %.2f)" % med("leaver_exit")
    return (model, change.label(), med("members_back"), med("to_training"),
            med("reported_ms"), med("to_boundary"), med("recovery"),
            med("stall"), med("step"), med("step_after"), med("lost"),
            joiner, med("cold"), med("to_training") / med("cold"),
            "; ".join(sorted(set(r["elastic"] for r in results))),
            "; ".join(sorted(set(r["resumed"] for r in results))))


if __name__ == "__main__":
    sys.exit(main())
