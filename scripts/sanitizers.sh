#!/usr/bin/env bash
# Runs the unit and multi-process tests under AddressSanitizer + UBSan
# (--config=asan) and ThreadSanitizer (--config=tsan), gcc builds like the
# main one, each in its own Bazel output base ($HOME/.cache/bazel_asan,
# $HOME/.cache/bazel_tsan) so the shared cache is kept. Prints Bazel's
# summary and one line per config: passed, failed, seconds.
#
#   bash scripts/sanitizers.sh [asan|tsan|all] [bazel target patterns...]
# Default targets: every test of the workspace except those listed in
# EXCLUDED below. Environment: SANITIZER_JOBS (Bazel --local_test_jobs, 1).
set -uo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
shift || true
root=$(pwd)
patterns=("$@")
if [ ${#patterns[@]} -eq 0 ]; then
  # Every top-level package folder (not the bazel-* links: another output
  # base's links would be walked into).
  for d in */; do
    d=${d%/}
    [[ $d == bazel-* || -L $d || $d == third_party || $d == dist ]] && continue
    [ -n "$(find "$d" -name BUILD -print -quit)" ] && patterns+=("//$d/...")
  done
fi
# Tests that cannot run sanitized, and why:
#  - launcher_test, netns_cluster_test: shell tests that start Slurm's
#    daemons and network namespaces around the binaries that cluster_test
#    runs (which does run here); they skip where not root, and a sanitized
#    build makes their fixed timeouts meaningless.
#  (tests/gpu_bundle_test.sh is not a Bazel test: scripts/test.sh runs it.)
EXCLUDED=(-//tests:launcher_test -//tests:netns_cluster_test)
status=0
summary=()
for config in asan tsan; do
  [ "$which" = all ] || [ "$which" = "$config" ] || continue
  env=()
  if [ $config = asan ]; then
    env+=(--test_env=LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0)
  else
    # history_size=7 (the most): TSan keeps enough of each thread's past
    # accesses to print the earlier access's stack. Without it a race whose
    # earlier access was made inside an uninstrumented library (gRPC,
    # protobuf: a memcpy of a message on our stack) is printed as "failed
    # to restore the stack", and tsan.supp cannot match that library.
    # OMP_NUM_THREADS=1: oneDNN's primitives run on the calling thread.
    # Debian's libgomp is not instrumented either, so TSan sees none of its
    # barriers and reports every write oneDNN's OpenMP threads make to
    # memory the caller allocated.
    env+=(--test_env=TSAN_OPTIONS=suppressions=$root/scripts/tsan.supp:halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:history_size=7
      --test_env=OMP_NUM_THREADS=1)
  fi
  log=$(mktemp)
  start=$(date +%s)
  bazel --output_base="$HOME/.cache/bazel_$config" test --config=$config \
    --keep_going --local_test_jobs="${SANITIZER_JOBS:-1}" \
    --test_timeout=600,1800,3600,7200 "${env[@]}" -- "${patterns[@]}" \
    "${EXCLUDED[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  seconds=$(($(date +%s) - start))
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS)' "$log")
  rm -f "$log"
  summary+=("$config: ${passed} passed, ${failed} failed, ${seconds} s (bazel exit ${rc})")
  [ "$rc" -eq 0 ] || status=1
done
printf 'sanitizers: %s\n' "${summary[@]}"
exit $status
