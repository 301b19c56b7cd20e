#!/bin/bash
# A 2 PS + 2 worker LeNet-5 job started by hand on this one node, as a user
# would without a launcher: prints the worker's thread line, the mean of the
# StepN data/sec lines and the results row. Extra arguments go to both
# workers, e.g. --threads=1 (BENCHMARKS.md: default threads against
# --threads on a shared node).
#   bash scripts/threads_bench.sh [BIN_DIR] [WORKER FLAGS...]
set -euo pipefail
B="$(cd "${1:-bazel-bin}" && pwd)"
shift || true
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$B/coordinator/pstrain_coordinator" --bind=127.0.0.1 --port="$P" >coord.log 2>&1 &
coordinator=$!
trap 'kill $coordinator; rm -rf "$TMP"' EXIT
sleep 0.5
echo 'num_ps: 2 num_workers: 2 batch_size: 64 epochs: 1 log_every_steps: 100' >job.pbtxt
JOB=$("$B/cli/pstrain" submit job.pbtxt --coordinator="127.0.0.1:$P")
for i in 0 1; do
  env -u OMP_NUM_THREADS "$B/server/pstrain_ps" --coordinator="127.0.0.1:$P" \
    --job="$JOB" --task_index=$i >ps$i.log 2>&1 &
  env -u OMP_NUM_THREADS "$B/worker/pstrain_worker" --coordinator="127.0.0.1:$P" \
    --job="$JOB" --task_index=$i "$@" >worker$i.log 2>&1 &
done
"$B/cli/pstrain" wait "$JOB" --coordinator="127.0.0.1:$P" >wait.log 2>&1 || true
grep -h -m1 -E 'threads? \(' worker0.log
grep -oE 'Step[0-9]+: [0-9.]+ data/sec' wait.log |
  awk '{s += $2; n++} END {printf "mean of %d StepN lines: %.0f data/sec\n", n, s / n}'
tail -1 wait.log
