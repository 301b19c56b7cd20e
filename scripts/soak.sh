#!/usr/bin/env bash
# Soak test (issue 22): real pstrain_ps shards under many workers' pushes for
# a bounded time, through `pstrain run --compute=synthetic` (each worker
# pushes --model_bytes of gradients per step and pulls the weights back, no
# compute). Prints, per interval, the job's throughput (sum over workers of
# their latest "data/sec" line) and every shard's resident memory (VmRSS of
# /proc/PID/status), then the RSS at start (first interval) and end, and
# fails on an error line, a task that died, or RSS growth of more than
# SOAK_MAX_GROWTH_PCT (default 10) percent between the second interval (after
# warm-up) and the end.
#
#   bash scripts/soak.sh [seconds, default 600]
# Environment: SOAK_WORKERS (8), SOAK_PS (2), SOAK_MODE (async),
# SOAK_MODEL_BYTES (4000000), SOAK_INTERVAL_S (seconds/10, at least 10),
# SOAK_MAX_GROWTH_PCT (10). Uses bazel-bin/cli/pstrain (built if missing).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
workers=${SOAK_WORKERS:-8}
num_ps=${SOAK_PS:-2}
mode=${SOAK_MODE:-async}
model_bytes=${SOAK_MODEL_BYTES:-4000000}
interval=${SOAK_INTERVAL_S:-$((seconds / 10))}
[ "$interval" -ge 10 ] || interval=10
max_growth=${SOAK_MAX_GROWTH_PCT:-10}

if [ ! -x bazel-bin/cli/pstrain ] || [ ! -x bazel-bin/server/pstrain_ps ] ||
   [ ! -x bazel-bin/worker/pstrain_worker ]; then
  bazel build //cli:pstrain //server:pstrain_ps //worker:pstrain_worker
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "soak: ${seconds} s, ${num_ps} shards, ${workers} workers, mode ${mode}," \
  "${model_bytes} bytes pushed and pulled per worker step"
bazel-bin/cli/pstrain run --insecure --compute=synthetic --compute_ms=0 \
  --model_bytes="$model_bytes" --mode="$mode" --num_ps="$num_ps" \
  --num_workers="$workers" --batch_size=32 --epochs=1 \
  --max_steps_per_epoch=1000000000 --log_every_steps=20 \
  --heartbeat_timeout_s=120 >"$log" 2>&1 &
run_pid=$!

# Every descendant of the run whose command is pstrain_ps.
shard_pids() {
  local all=$run_pid frontier=$run_pid next
  while [ -n "$frontier" ]; do
    next=$(for p in $frontier; do pgrep -P "$p"; done | tr '\n' ' ')
    all="$all $next"
    frontier=$next
  done
  for p in $all; do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = pstrain_ps ] && echo "$p"
  done
}
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Sum over workers of each one's latest "... N data/sec" line (pstrain run
# prints worker 0's: the rate of one of the workers).
throughput() {
  grep -E '^\[?worker[ -]?[0-9]+' "$log" 2>/dev/null |
    grep -oE '^\[?worker[ -]?[0-9]+|[0-9.]+ data/sec' |
    awk '/^\[?worker/ {w=$0; next} {rate[w]=$1} END {s=0; for (w in rate) s+=rate[w]; printf "%.1f", s}'
}

sleep 5
start=$(date +%s)
printf '%8s %16s %s\n' "time_s" "worker0 data/sec" "shard RSS (MiB)"
first_rss="" warm_rss="" last_rss="" status=0 n=0
while true; do
  now=$(date +%s)
  elapsed=$((now - start))
  if ! kill -0 "$run_pid" 2>/dev/null; then
    echo "soak: pstrain run ended early, at ${elapsed} s"
    status=1
    break
  fi
  rss=""
  for p in $(shard_pids); do rss="$rss $(($(rss_kb "$p") / 1024))"; done
  printf '%8d %16s %s\n' "$elapsed" "$(throughput)" "$rss"
  n=$((n + 1))
  [ -n "$first_rss" ] || first_rss=$rss
  [ "$n" -eq 2 ] && warm_rss=$rss
  last_rss=$rss
  [ "$elapsed" -ge "$seconds" ] && break
  sleep "$interval"
done
# Only the lines before the interrupt count (the tasks report SIGINT as an
# error when they stop).
before=$(wc -l <"$log")
kill -INT "$run_pid" 2>/dev/null
wait "$run_pid" 2>/dev/null
head -n "$before" "$log" >"$log.before"
pattern='error|failed|fatal|check failed|lost |non-finite|skipped'
errors=$(grep -ciE "$pattern" "$log.before")
lines=$(grep -cE 'data/sec' "$log.before")
echo "soak: ${lines} throughput lines, last: $(grep -E 'data/sec' "$log.before" | tail -1)"
echo "soak: shard RSS MiB at start:${first_rss}, after warm-up:${warm_rss}," \
  "at end:${last_rss}"
if [ "$errors" -gt 0 ]; then
  echo "soak: FAIL: ${errors} error lines, first ones:"
  grep -iE "$pattern" "$log.before" | head -5
  status=1
fi
rm -f "$log.before"
if [ -n "$warm_rss" ]; then
  set -- $warm_rss
  warm=("$@")
  set -- $last_rss
  i=0
  for end in "$@"; do
    w=${warm[$i]:-0}
    if [ "$w" -gt 0 ] && [ $((end * 100)) -gt $((w * (100 + max_growth))) ]; then
      echo "soak: FAIL: shard $i RSS grew from ${w} MiB to ${end} MiB (> ${max_growth}%)"
      status=1
    fi
    i=$((i + 1))
  done
fi
[ "$lines" -gt 0 ] || { echo "soak: FAIL: no throughput line"; status=1; }
echo "soak: $([ $status = 0 ] && echo PASS || echo FAIL)"
[ "$status" = 0 ] || tail -20 "$log"
exit $status
