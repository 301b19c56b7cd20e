#!/bin/bash
# Tracing overhead (issue 24, BENCHMARKS.md): interleaved `pstrain run`
# jobs without and with --trace (2 shards, 2 sync workers, synthetic data),
# printing per run: model, trace off/on, step time (ms: compute + exchange
# per step from results.json, the first step left out), steps, samples/sec,
# trace events written, test accuracy.
#
#   bench/trace_overhead.sh MODEL BATCH STEPS IMAGE_SIZE REPEATS [SAMPLES]
#
# Needs bazel-bin/cli/pstrain (bazel build //cli:pstrain). Runs go to
# ${OUT:-/tmp/trace_overhead}.
set -u
if [ $# -lt 5 ]; then
  echo "usage: $0 MODEL BATCH STEPS IMAGE_SIZE REPEATS [SAMPLES]" >&2
  exit 2
fi
M=$1; B=$2; S=$3; I=$4; R=$5; SS=${6:-512}
P=${PSTRAIN:-bazel-bin/cli/pstrain}
OUT=${OUT:-/tmp/trace_overhead}
mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for mode in off on; do
    D=$OUT/${M}_${mode}_$r
    rm -rf "$D"
    extra=""
    [ "$mode" = on ] && extra="--trace"
    if ! "$P" run --model="$M" --dataset=synthetic --synthetic_samples="$SS" \
        --num_classes=10 --image_size="$I" --batch_size="$B" --epochs=1 \
        --max_steps_per_epoch="$S" --num_ps=2 --num_workers=2 --mode=sync \
        --log_every_steps="$S" --metrics_dir="$D" $extra \
        --results_json="$D/results.json" > "$D.log" 2>&1; then
      echo "FAILED: $D (see $D.log)" >&2
      continue
    fi
    python3 - "$D" "$mode" "$M" <<'PY'
import glob, json, sys
d, mode, model = sys.argv[1:]
r = json.load(open(d + "/results.json"))
step = (r["compute_seconds_per_step"] + r["exchange_seconds_per_step"]) * 1e3
events = 0
for f in glob.glob(d + "/trace/*.json"):
    events += sum(1 for e in json.load(open(f)) if e["ph"] == "X")
print(model, mode, "%.2f" % step, r["steps"],
      "%.2f" % r["throughput_samples_per_sec"], events,
      "%.4f" % r.get("test_accuracy", 0))
PY
  done
done
