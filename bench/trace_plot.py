#!/usr/bin/env python3
"""Draws one training step of a merged pstrain trace (`pstrain trace`) as a
PNG timeline with gnuplot: one row per task and kind of work (a worker's
compute, its pushes and pulls per shard, its barrier wait, or its bucket
allreduces and updates; a shard's received pushes, updates and pulls it
serves), time in ms from the step's start on worker 0 (the coordinator's
clock, as merged).

  bench/trace_plot.py TRACE.json OUT.png [--step=N] [--title=TEXT]

Needs gnuplot (Debian's package). Exit 2 on bad input.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# Event name -> (legend label, gnuplot colour).
KINDS = {
    "forward": ("forward", "#4477aa"),
    "backward": ("backward (per layer)", "#66ccee"),
    "push": ("push (per chunk)", "#228833"),
    "barrier wait": ("barrier wait", "#ee6677"),
    "pull": ("pull (per chunk)", "#ccbb44"),
    "update": ("shard update: average + optimizer", "#aa3377"),
    "shard push": ("shard: push received", "#88cc88"),
    "shard pull": ("shard: pull served (waits for the barrier)", "#dddddd"),
    "allreduce": ("allreduce (per bucket)", "#ee7733"),
    "worker update": ("optimizer (per bucket)", "#aa3377"),
}


def lane_of(e):
    """(sort key, row label, kind) of an event, or None to leave it out."""
    pid, name, args = e["pid"], e["name"], e.get("args", {})
    if pid >= 100:
        w = pid - 100
        if name in ("forward", "backward"):
            return ((w, 0, 0), "worker %d compute" % w, name)
        if name == "push":
            s = args.get("shard", 0)
            return ((w, 1, s), "worker %d push to ps %d" % (w, s), name)
        if name == "barrier wait":
            return ((w, 2, 0), "worker %d barrier wait" % w, name)
        if name == "pull":
            s = args.get("shard", 0)
            return ((w, 3, s), "worker %d pull from ps %d" % (w, s), name)
        if name == "allreduce":
            return ((w, 4, 0), "worker %d allreduce" % w, name)
        if name == "update":
            return ((w, 4, 0), "worker %d allreduce" % w, "worker update")
        return None
    k = 1000 + pid
    if name == "push":
        return ((k, 0, 0), "ps %d pushes received" % pid, "shard push")
    if name == "update":
        return ((k, 1, 0), "ps %d updates" % pid, "update")
    if name == "pull":
        return ((k, 2, 0), "ps %d pulls served" % pid, "shard pull")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("out")
    parser.add_argument("--step", type=int, default=-1,
                        help="worker 0's step to draw (default: the middle "
                             "one)")
    parser.add_argument("--title", default="")
    a = parser.parse_args()
    try:
        with open(a.trace) as f:
            events = [e for e in json.load(f)["traceEvents"]
                      if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        print("trace_plot: %s: %s; expected a merged trace (pstrain trace)"
              % (a.trace, err), file=sys.stderr)
        return 2
    steps = sorted((e["args"]["step"], e) for e in events
                   if e["pid"] == 100 and e["name"] == "step")
    if not steps:
        print("trace_plot: %s: no step of worker 0" % a.trace,
              file=sys.stderr)
        return 2
    chosen = dict(steps).get(a.step) if a.step >= 0 else \
        steps[len(steps) // 2][1]
    if chosen is None:
        print("trace_plot: --step=%d: worker 0 has steps %d to %d"
              % (a.step, steps[0][0], steps[-1][0]), file=sys.stderr)
        return 2
    t0 = chosen["ts"]
    t1 = t0 + chosen["dur"]
    step = chosen["args"]["step"]
    lanes, rows = {}, []
    for e in events:
        if e["ts"] + e["dur"] < t0 or e["ts"] > t1:
            continue
        if e["pid"] < 100 and e["args"].get("step", step) not in (step,):
            if e["name"] != "pull":
                continue
        lane = lane_of(e)
        if lane is None:
            continue
        lanes[lane[0]] = lane[1]
        rows.append((lane[0], lane[2], e["ts"], e["dur"]))
    order = sorted(lanes)
    y_of = {key: len(order) - i for i, key in enumerate(order)}
    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for key, kind, ts, dur in rows:
            x0 = (max(ts, t0) - t0) / 1e3
            x1 = (min(ts + dur, t1) - t0) / 1e3
            # Short events stay visible: at least 0.2% of the step.
            half = max((x1 - x0) / 2, (t1 - t0) / 1e3 * 0.001)
            data.setdefault(kind, []).append(
                "%f %d %f 0.35" % ((x0 + x1) / 2, y_of[key], half))
        plots = []
        for kind, (label, colour) in KINDS.items():
            if kind not in data:
                continue
            path = os.path.join(tmp, kind.replace(" ", "_") + ".dat")
            with open(path, "w") as f:
                f.write("\n".join(data[kind]) + "\n")
            plots.append("'%s' using 1:2:3:4 with boxxyerror fs solid 0.9 "
                         "noborder lc rgb '%s' title '%s'"
                         % (path, colour, label))
        ytics = ", ".join('"%s" %d' % (lanes[k], y_of[k]) for k in order)
        title = a.title or "One step (%d) of a traced job" % step
        script = "\n".join([
            "set terminal pngcairo size 1600,%d font 'DejaVu Sans,11'"
            % (160 + 28 * len(order)),
            "set output '%s'" % a.out,
            "set title '%s'" % title.replace("'", "''"),
            "set xlabel 'time from the start of worker 0''s step (ms, "
            "coordinator clock)'",
            "set ytics (%s)" % ytics,
            "set yrange [0.4:%f]" % (len(order) + 0.6),
            "set xrange [0:%f]" % ((t1 - t0) / 1e3),
            "set grid xtics",
            "set key outside bottom center horizontal",
            "plot " + ", \\\n  ".join(plots),
        ])
        result = subprocess.run(["gnuplot"], input=script, text=True,
                                capture_output=True)
        if result.returncode != 0:
            print("trace_plot: gnuplot: " + result.stderr.strip(),
                  file=sys.stderr)
            return 1
    print("wrote %s: step %d, %.1f ms, %d events in %d rows"
          % (a.out, step, (t1 - t0) / 1e3, len(rows), len(order)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
