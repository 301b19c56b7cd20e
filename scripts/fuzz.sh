#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang-14 (--config=fuzz, in its
# own Bazel output base so the shared gcc cache is kept) and runs each for a
# bounded time in one process (one core), starting from its committed corpus
# (fuzz/corpus/<target>/, read only: new inputs go to a scratch folder).
# Prints a table: target, execs/s, seconds, corpus size, crashes, slow
# units (inputs over libFuzzer's 10 s: copied to fuzz/slow/<target>/, not
# a failure). A crash's input is copied to fuzz/crashes/<target>/
# (reproduce with `<binary> <input>`; once fixed, commit it under
# fuzz/corpus/<target>/ as crash-<what>). Exit 1 if any target crashed.
#
#   bash scripts/fuzz.sh [seconds_per_target, default 300] [target ...]
# Environment: FUZZ_OUTPUT_BASE (default $HOME/.cache/bazel_fuzz),
# FUZZ_RSS_LIMIT_MB (2048), FUZZ_SEED (1: the same inputs in the same order
# on every run, so a CI run's result does not depend on luck; 0: libFuzzer
# picks one), FUZZ_CORPUS_DIR (unset: the inputs a run finds are dropped at
# its end; set: they go to and are kept in $FUZZ_CORPUS_DIR/<target>/, a
# later run starts from them too, and each run appends a line to
# $FUZZ_CORPUS_DIR/runs.tsv: UTC time, commit, target, seconds, execs,
# crashes. So a target's fuzzing adds up over runs and sessions:
# `awk -F'\t' '{s[$3]+=$4} END {for (t in s) print t, s[t]/3600, "h"}'`).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=($(sed -n 's/^ *name = "\(.*_fuzzer\)",$/\1/p' fuzz/BUILD))
fi
bash scripts/setup.sh --fuzz --install_only || exit 1
output_base=${FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel_fuzz}
bazel=(bazel --output_base="$output_base")
labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
"${bazel[@]}" build --config=fuzz "${labels[@]}" || exit 1
bin=$("${bazel[@]}" info --config=fuzz bazel-bin 2>/dev/null)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=()
status=0
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
for t in "${targets[@]}"; do
  corpus_dir="$work/$t/corpus"
  [ -n "${FUZZ_CORPUS_DIR:-}" ] && corpus_dir="$FUZZ_CORPUS_DIR/$t"
  mkdir -p "$corpus_dir" "$work/$t/artifacts"
  log="$work/$t/log"
  start=$(date +%s.%N)
  "$bin/fuzz/$t" -max_total_time="$seconds" \
    -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" -timeout=25 -print_final_stats=1 \
    -seed="${FUZZ_SEED:-1}" \
    -artifact_prefix="$work/$t/artifacts/" "$corpus_dir" \
    "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # libFuzzer also writes slow-unit-* (an input over 10 s): reported in
  # their own column and kept, not a failure.
  crashes=$(find "$work/$t/artifacts" -type f ! -name 'slow-unit-*' | wc -l)
  slow=$(find "$work/$t/artifacts" -type f -name 'slow-unit-*' | wc -l)
  if [ "$slow" -gt 0 ]; then
    mkdir -p "fuzz/slow/$t"
    cp "$work/$t/artifacts/"slow-unit-* "fuzz/slow/$t/" 2>/dev/null
  fi
  corpus=$(($(find "$corpus_dir" -type f | wc -l) +
    $(find "fuzz/corpus/$t" -type f | wc -l)))
  if [ "$crashes" -gt 0 ] || { [ $rc -ne 0 ] && [ -z "$rate" ]; }; then
    status=1
    mkdir -p "fuzz/crashes/$t"
    find "$work/$t/artifacts" -type f ! -name 'slow-unit-*' \
      -exec cp {} "fuzz/crashes/$t/" \;
    echo "== $t: crashed (exit $rc); input in fuzz/crashes/$t/; log tail:"
    # (libprotobuf's parse warnings also say ERROR: CI's log tail once held
    # nothing else and hid the failed check.)
    grep -E "ERROR|==[0-9]+==|SUMMARY|check failed|runtime error|#[0-9]+ 0x" \
      "$log" | grep -v "libprotobuf ERROR" | head -25
  fi
  seconds_run=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", b - a}')
  if [ -n "${FUZZ_CORPUS_DIR:-}" ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$commit" "$t" \
      "$seconds_run" "${runs:-0}" "$crashes" >>"$FUZZ_CORPUS_DIR/runs.tsv"
  fi
  rows+=("$(printf '%-28s %10s %12s %8.0f %8s %8d %6d' "$t" "${rate:-?}" \
    "${runs:-?}" "$seconds_run" \
    "$corpus" "$crashes" "$slow")")
done
printf '%-28s %10s %12s %8s %8s %8s %6s\n' target execs/s execs seconds \
  corpus crashes slow
printf '%s\n' "${rows[@]}"
exit $status
