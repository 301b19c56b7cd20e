#!/bin/bash
# scripts/link_profile.py's report on samples whose phases are known: 13
# steps of 1000 ms, each with 600 ms of pushes into the shard (800 Mbit/s),
# pulls out of it from 100 to 700 ms (400 Mbit/s) and 300 ms of quiet links,
# one late 10-ms burst of pushes in one step's quiet; then its errors.
set -euo pipefail
PROFILE="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-pstrain}/scripts/link_profile.py"
[[ -f "$PROFILE" ]] || PROFILE="$(dirname "$0")/../scripts/link_profile.py"
DIR="${TEST_TMPDIR:-$(mktemp -d)}"
# samples FILE PULL_END BURST: the steps above, pulls until PULL_END of
# each step (1.0: the next step's first push), the late burst if BURST.
samples() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys
path, pull_end, burst = sys.argv[1], float(sys.argv[2]), sys.argv[3] == '1'
with open(path, 'w') as out:
    out.write('t_s,p0_to_host,p0_from_host,w0_to_host,w0_from_host\n')
    to_host = from_host = 0.0
    dt = 0.005
    for i in range(int(13.0 / dt)):
        t = i * dt
        phase = t % 1.0
        if phase < 0.6:
            to_host += 800e6 / 8 * dt
        if burst and 5.8 <= t < 5.81:  # the late burst, in step 5's quiet
            to_host += 800e6 / 8 * dt
        if 0.1 <= phase < pull_end:
            from_host += 400e6 / 8 * dt
        out.write(f'{t + dt:.4f},{int(to_host)},{int(from_host)},0,0\n')
PY
}
# expect_medians FILE PULL_TAIL IDLE: the report's medians (ms) of 10
# steps of 1000 ms with 600 ms of ingress.
expect_medians() {
  python3 "$PROFILE" report "$1" --ps=p0 >"$1.md"
  cat "$1.md"
  python3 - "$1.md" "$2" "$3" <<'PY'
import sys
text = open(sys.argv[1]).read()
# 13 steps begin; the last has no next step to end it, 2 are skipped.
assert '10 steps after the first 2' in text, 'expected 10 steps counted'
rows = {}
for line in text.splitlines():
    cells = [c.strip() for c in line.strip('|').split('|')]
    if len(cells) == 4 and cells[1].isdigit():
        rows[cells[0].split(' (')[0]] = [int(c) for c in cells[1:]]
want = {'step': 1000, "shards' ingress": 600,
        'pull tail': int(sys.argv[2]), 'links idle': int(sys.argv[3])}
for name, ms in want.items():
    median = rows[name][0]
    assert abs(median - ms) <= 10, f'{name}: median {median} ms, expected {ms}'
print('medians as built')
PY
}
samples "$DIR/samples.csv" 0.7 1
expect_medians "$DIR/samples.csv" 100 300
# An early forward (priority pulls): the pulls run from 100 ms to the
# next step's first push, so the links are never idle; steps are still
# cut where the pushes begin after quiet ingress.
samples "$DIR/overlap.csv" 1.0 0
expect_medians "$DIR/overlap.csv" 400 0
# Errors: exit 2 and one line naming the input.
expect_error() {
  local want="$1"
  shift
  if python3 "$PROFILE" "$@" 2>"$DIR/err"; then
    echo "FAIL: $* succeeded"
    exit 1
  else
    local rc=$?
    [[ $rc == 2 ]] || { echo "FAIL: $* exited $rc, expected 2"; exit 1; }
  fi
  grep -q "$want" "$DIR/err" || {
    echo "FAIL: $*: expected \"$want\" in: $(cat "$DIR/err")"
    exit 1
  }
}
expect_error "no column p7_to_host" report "$DIR/samples.csv" --ps=p7
expect_error "cannot read it" report "$DIR/missing.csv" --ps=p0
printf 't_s,p0_to_host,p0_from_host\n1,x,2\n' >"$DIR/bad.csv"
expect_error "cannot read it" report "$DIR/bad.csv" --ps=p0
expect_error "expected --bin_ms > 0" report "$DIR/samples.csv" --ps=p0 \
  --bin_ms=0
echo PASS
