#!/bin/bash
# Peak resident memory (VmHWM) of a pstrain worker training a few steps on
# an IDX dataset folder, to check that it does not grow with the dataset's
# size (plain IDX files are memory-mapped: worker/mapped_file.h).
#
#   bench/dataset_rss.sh DATA_DIR [DATA_DIR ...]
#
# Runs `pstrain run --num_ps=1 --num_workers=1 --model=mlp --batch_size=64
# --epochs=1 --max_steps_per_epoch=$STEPS` (STEPS default 200) on each folder
# with --dataset=mnist, samples /proc/PID/status of the worker every 0.1 s,
# and prints one row per folder: training samples, worker peak RSS (MiB),
# RSS at the end (MiB), the ratio of the peak to the first folder's, the
# peak of the anonymous part (RssAnon: the worker's own memory; the rest
# is mapped file pages, page cache the kernel can reclaim) and its ratio,
# and whether the run exited 0. Needs bazel-bin/cli/pstrain (bazel build
# //cli:pstrain).
#
# DATASET=image_folder DATA_ARGS="--image_size=28 --stream_images" measures
# an image-folder tree instead (samples then counted from its train/ files),
# e.g. Fashion-MNIST written by export_image_folder, loaded against
# streamed; MODEL (mlp) and THROUGHPUT=1 (print the run's samples/sec) too.
set -u
STEPS=${STEPS:-200}
DATASET=${DATASET:-mnist}
DATA_ARGS=${DATA_ARGS:-}
MODEL=${MODEL:-mlp}
PSTRAIN=${PSTRAIN:-bazel-bin/cli/pstrain}
descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1"); do
    echo "$p"
    descendants "$p"
  done
}
printf '%-28s %10s %10s %10s %7s %10s %7s %4s\n' "# data_dir" samples \
  peak_rss end_rss ratio peak_anon ratio ok
printf '%-28s %10s %10s %10s %7s %10s %7s %4s\n' "#" "(#)" "(MiB)" "(MiB)" \
  "(vs 1st)" "(MiB)" "(vs 1st)" ""
first=""
first_anon=""
for dir in "$@"; do
  if [ "$DATASET" = mnist ]; then
    samples=$(od -An -tu1 -j4 -N4 "$dir/train-labels-idx1-ubyte" |
      awk '{print $1*16777216+$2*65536+$3*256+$4}')
  else
    samples=$(find "$dir/train" -type f | wc -l)
  fi
  log=$(mktemp)
  # shellcheck disable=SC2086
  "$PSTRAIN" run --dataset="$DATASET" --data_dir="$dir" $DATA_ARGS \
    --model="$MODEL" --num_ps=1 --num_workers=1 --batch_size=64 --epochs=1 \
    --max_steps_per_epoch="$STEPS" >"$log" 2>&1 &
  run=$!
  peak=0
  last=0
  anon_peak=0
  while kill -0 "$run" 2>/dev/null; do
    for p in $(descendants "$run"); do
      if grep -q pstrain_worker "/proc/$p/cmdline" 2>/dev/null; then
        h=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null)
        r=$(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null)
        a=$(awk '/RssAnon/ {print $2}' "/proc/$p/status" 2>/dev/null)
        [ -n "$a" ] && [ "$a" -gt "$anon_peak" ] && anon_peak=$a
        [ -n "$h" ] && [ "$h" -gt "$peak" ] && peak=$h
        [ -n "$r" ] && last=$r
      fi
    done
    sleep 0.1
  done
  wait "$run"
  rc=$?
  [ "$rc" = 0 ] && ok=yes || ok="no($rc)"
  [ -z "$first" ] && first=$peak
  [ -z "$first_anon" ] && first_anon=$anon_peak
  awk -v d="$dir" -v s="$samples" -v p="$peak" -v e="$last" -v f="$first" \
    -v a="$anon_peak" -v fa="$first_anon" -v ok="$ok" \
    'BEGIN { printf "%-28s %10d %10.1f %10.1f %7.3f %10.1f %7.3f %4s\n",
      d, s, p / 1024, e / 1024, (f > 0 ? p / f : 0), a / 1024,
      (fa > 0 ? a / fa : 0), ok }'
  [ "$rc" = 0 ] || tail -3 "$log" >&2
  if [ "${THROUGHPUT:-0}" = 1 ]; then
    grep -E '^\| [0-9]' "$log" | tail -1
  fi
  rm -f "$log"
done
