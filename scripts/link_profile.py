#!/usr/bin/env python3
"""Where a sync PS step's time goes on emulated links (scripts/emulated_links.sh).

  link_profile.py sample OUT.csv [--interval_ms=5] [--strip_prefix=P]
      Run inside the switch's network namespace: every --interval_ms it
      reads the byte counters of every switch port
      (/sys/class/net/PORT/statistics), one CSV row per read (t_s, then
      PORT_to_host and PORT_from_host in bytes for each port, PORT without
      the prefix P), until it is sent SIGTERM or a port goes away.

  link_profile.py report SAMPLES.csv --ps=PORT,... [--bin_ms=10]
                         [--skip_steps=2] [--active_mbit=100] [--quiet_ms=60]
                         [--min_ingress_ms=100]
      Reads the samples and prints a Markdown table of each phase of a sync
      PS step, in ms (median, min and max over the steps): the shards'
      ingress (first pushed byte in to the last), the pull tail (the last
      pushed byte in to the last pulled byte out) and the links' idle gap
      before the next step's pushes (the forward pass that no transfer
      overlaps). A step starts where the shards' ingress rises above
      --active_mbit after at least --quiet_ms of quiet ingress on every PS
      link (their egress may still run: an early forward's pulls) and
      stays up for --min_ingress_ms (a shorter burst belongs to the step
      before it).

The phases are what bounds priority pulls (issue 39 item 4): the next
step's forward can overlap only transfers still running when its first
tensors arrive, and in a sync step the front tensors' gradients are the
last pushed, so their pulls are the tail.
"""

import argparse
import bisect
import os
import signal
import statistics
import sys
import time


def die(message):
    print(f'link_profile.py: error: {message}', file=sys.stderr)
    sys.exit(2)


def sample(out_path, interval_ms, strip_prefix):
    ports = sorted(p for p in os.listdir('/sys/class/net')
                   if p not in ('lo', 'br0'))
    names = [p[len(strip_prefix):] if p.startswith(strip_prefix) else p
             for p in ports]
    files = []
    for p in ports:
        base = f'/sys/class/net/{p}/statistics/'
        # A switch port's tx is what goes to its host, rx what comes from it.
        files.append((open(base + 'tx_bytes'), open(base + 'rx_bytes')))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    t0 = time.monotonic()
    with open(out_path, 'w') as out:
        out.write('t_s,' + ','.join(f'{p}_to_host,{p}_from_host'
                                    for p in names) + '\n')
        while not stop:
            row = [f'{time.monotonic() - t0:.4f}']
            try:
                for to_host, from_host in files:
                    to_host.seek(0)
                    from_host.seek(0)
                    row += [to_host.read().strip(), from_host.read().strip()]
            except OSError:  # a port went away: the run is over
                break
            out.write(','.join(row) + '\n')
            time.sleep(interval_ms / 1000)


def report(args):
    try:
        with open(args.samples) as f:
            header = f.readline().strip().split(',')
            rows = [[float(x) for x in line.split(',')] for line in f
                    if line.count(',') == len(header) - 1]
    except (OSError, ValueError) as e:
        die(f'{args.samples}: cannot read it as '
                 f'link_profile.py samples: {e}')
    if len(rows) < 2:
        die(f'{args.samples}: expected at least '
                 'two rows of samples')
    ps = args.ps.split(',')
    cols = {}
    for p in ps:
        for side in ('to_host', 'from_host'):
            name = f'{p}_{side}'
            if name not in header:
                die(f'--ps={args.ps}: no column '
                         f'{name} in {args.samples}')
            cols[(p, side)] = header.index(name)
    ts = [r[0] for r in rows]

    def at(t):
        return rows[min(bisect.bisect_left(ts, t), len(rows) - 1)]

    b = args.bin_ms / 1000
    bins = []  # (t, ingress Mbit/s, egress Mbit/s) over the PS links
    t = ts[0]
    while t + b <= ts[-1]:
        x, y = at(t), at(t + b)
        rate = lambda side: sum(y[cols[(p, side)]] - x[cols[(p, side)]]
                                for p in ps) * 8 / b / 1e6
        bins.append((t, rate('to_host'), rate('from_host')))
        t += b
    # Quiet is the shards' ingress only: with an early forward (priority
    # pulls) the pulls run into the next step's forward, and the links may
    # never be idle between steps; a step's pulls end before the next
    # step's pushes begin (its backward needs the whole pull).
    steps, quiet, cur = [], args.quiet_ms / 1000, None
    for t, ingress, egress in bins:
        if ingress > args.active_mbit:
            if quiet * 1000 >= args.quiet_ms:
                if cur:
                    steps.append(cur)
                cur = {'start': t, 'push_end': t + b, 'pull_end': t + b}
            quiet = 0.0
            if cur:
                cur['push_end'] = t + b
        else:
            quiet += b
        if cur and egress > args.active_mbit:
            cur['pull_end'] = t + b
    if cur:
        steps.append(cur)  # ends no step: the run's last has no next start
    # A short burst after a quiet gap (a late retransmission, a heartbeat)
    # is part of the step before it, not a step.
    merged = []
    for s in steps:
        if merged and s['push_end'] - s['start'] < args.min_ingress_ms / 1000:
            merged[-1]['push_end'] = max(merged[-1]['push_end'], s['push_end'])
            merged[-1]['pull_end'] = max(merged[-1]['pull_end'], s['pull_end'])
        else:
            merged.append(s)
    steps = merged
    phases = {'step': [], 'ingress': [], 'pull tail': [], 'idle': []}
    for s, n in zip(steps, steps[1:]):
        phases['step'].append(n['start'] - s['start'])
        phases['ingress'].append(s['push_end'] - s['start'])
        phases['pull tail'].append(max(0.0, s['pull_end'] - s['push_end']))
        phases['idle'].append(max(0.0, n['start'] - s['pull_end']))
    for v in phases.values():
        del v[:args.skip_steps]
    if not phases['step']:
        die(f'{args.samples}: found '
                 f'{len(steps)} steps, expected more than --skip_steps='
                 f'{args.skip_steps} + 1')
    print(f'Link profile of the PS links ({args.ps}): {len(phases["step"])} '
          f'steps after the first {args.skip_steps}, {args.bin_ms} ms bins '
          f'(scripts/link_profile.py)\n')
    print('| phase | median (ms) | min (ms) | max (ms) |')
    print('|---|---:|---:|---:|')
    names = {
        'step': 'step (push start to push start)',
        'ingress': "shards' ingress (first pushed byte in to the last)",
        'pull tail': 'pull tail (last pushed byte in to last pulled byte out)',
        'idle': 'links idle (pulls done to next push: forward not overlapped)',
    }
    for key, v in phases.items():
        ms = [x * 1000 for x in v]
        print(f'| {names[key]} | {statistics.median(ms):.0f} | '
              f'{min(ms):.0f} | {max(ms):.0f} |')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    s = sub.add_parser('sample')
    s.add_argument('out')
    s.add_argument('--interval_ms', type=float, default=5)
    s.add_argument('--strip_prefix', default='')
    r = sub.add_parser('report')
    r.add_argument('samples')
    r.add_argument('--ps', required=True)
    r.add_argument('--bin_ms', type=float, default=10)
    r.add_argument('--skip_steps', type=int, default=2)
    r.add_argument('--active_mbit', type=float, default=100)
    r.add_argument('--quiet_ms', type=float, default=60)
    r.add_argument('--min_ingress_ms', type=float, default=100)
    args = parser.parse_args()
    if args.command == 'sample':
        sample(args.out, args.interval_ms, args.strip_prefix)
    else:
        if args.bin_ms <= 0 or args.quiet_ms < args.bin_ms:
            die('expected --bin_ms > 0 and '
                     '--quiet_ms >= --bin_ms')
        report(args)


if __name__ == '__main__':
    main()
