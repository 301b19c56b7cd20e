#!/usr/bin/env bash
# Checks the GPU bundle that scripts/gpu_bundle.sh made, so that it cannot
# rot unnoticed on machines without a GPU:
#   - its layout: every binary gpu_check.sh runs, the PyTorch scripts, the
#     dataset, BUNDLE_INFO;
#   - every ELF file's needed libraries are in the bundle's lib/ or are
#     glibc's or NVIDIA's (what a GPU host provides), and the binaries find
#     lib/ through an $ORIGIN rpath, not through paths of this machine;
#   - gpu_check.sh --quick --dry_run runs the non-GPU sections and marks the
#     GPU ones "skipped: no GPU", writing gpu_report.md and a JSON that parses;
#   - gpu_check.sh refuses bad arguments with exit 2.
# Prints "SKIP: ..." and exits 0 where no CUDA toolkit is installed (the
# bundle cannot be built there). Run by scripts/test.sh after
# `bash scripts/gpu_bundle.sh`.
#
#   bash tests/gpu_bundle_test.sh [BUNDLE_DIR]   (default dist/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-dist/gpu}
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "SKIP: no CUDA toolkit in /usr/local/cuda: the GPU bundle is not built here"
  exit 0
fi
failures=0
checks=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  checks=$((checks + 1))
  if "$@"; then
    echo "ok: $what"
  else
    echo "FAIL: $what"
    failures=$((failures + 1))
  fi
}

# --- layout ----------------------------------------------------------------
for f in cli/pstrain coordinator/pstrain_coordinator bench/train_bench \
  bench/ps_bench server/pstrain_ps worker/pstrain_worker tests/cuda_test \
  tests/cuda_transformer_test tests/collective_test tests/precision_test \
  gpu_check.sh; do
  check "$bundle/$f is executable" test -x "$bundle/$f"
done
for f in tools/torch/torch_bench.py tools/torch/torch_models.py BUNDLE_INFO \
  data/fashion-mnist/train-images-idx3-ubyte.gz \
  data/fashion-mnist/t10k-labels-idx1-ubyte.gz; do
  check "$bundle/$f exists" test -s "$bundle/$f"
done

# --- libraries -------------------------------------------------------------
source scripts/gpu_host_libs.sh  # host_lib_re
unresolved() {  # prints "FILE: LIBRARY" for each need the bundle leaves open
  local elf need
  for elf in "$bundle"/cli/* "$bundle"/coordinator/* "$bundle"/bench/* \
    "$bundle"/server/* "$bundle"/worker/* "$bundle"/tests/* "$bundle"/lib/*; do
    head -c 4 "$elf" | grep -q ELF || continue
    for need in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [[ "$need" =~ $host_lib_re ]] && continue
      [ -e "$bundle/lib/$need" ] || echo "$elf: $need"
    done
  done
}
open_needs=$(unresolved)
[ -n "$open_needs" ] && echo "$open_needs"
check "every needed library is in lib/, glibc's or NVIDIA's" test -z "$open_needs"
bad_rpath=""
for elf in "$bundle"/cli/pstrain "$bundle"/coordinator/pstrain_coordinator \
  "$bundle"/bench/train_bench "$bundle"/bench/ps_bench \
  "$bundle"/server/pstrain_ps "$bundle"/worker/pstrain_worker \
  "$bundle"/tests/cuda_test "$bundle"/tests/collective_test; do
  rpath=$(readelf -d "$elf" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p;s/.*(RPATH).*\[\(.*\)\]/\1/p')
  [ "$rpath" = '$ORIGIN/../lib' ] || bad_rpath+="$elf: '$rpath' "
done
[ -n "$bad_rpath" ] && echo "$bad_rpath"
check "binaries find lib/ through \$ORIGIN/../lib alone" test -z "$bad_rpath"
check "the NVIDIA libraries are not bundled" \
  bash -c "! ls '$bundle/lib' | grep -Eq '^lib(cudart|cublas|cudnn|nccl|cuda)\.'"
check "pstrain starts from the bundle" \
  bash -c "'$bundle/cli/pstrain' --help 2>&1 | grep -q 'pstrain run'"

# --- gpu_check.sh ------------------------------------------------------------
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash "$bundle/gpu_check.sh" > "$out/no_args.log" 2>&1
check "gpu_check.sh without an output folder exits 2" test $? -eq 2
bash "$bundle/gpu_check.sh" --only=warp_drive "$out/x" > "$out/bad_only.log" 2>&1
rc=$?
check "gpu_check.sh --only=warp_drive exits 2 naming the section" \
  bash -c "[ $rc -eq 2 ] && grep -q \"unknown section 'warp_drive'\" '$out/bad_only.log'"

echo "gpu_bundle_test: running gpu_check.sh --quick --dry_run"
bash "$bundle/gpu_check.sh" --quick --dry_run "$out/report" > "$out/dry_run.log" 2>&1
rc=$?
cat "$out/dry_run.log"
check "the dry run exits 0" test $rc -eq 0
report="$out/report/gpu_report.md"
check "the dry run wrote gpu_report.md" test -s "$report"
check "gpu_report.json parses and has nine sections" python3 -c "
import json, sys
r = json.load(open('$out/report/gpu_report.json'))
names = [s['section'] for s in r['sections']]
sys.exit(names != ['host', 'cuda_tests', 'train_bench', 'transformer', 'bert_table', 'pstrain_run', 'allreduce', 'ps_worker', 'ps_bench', 'priority_pulls'])"
for s in cuda_tests train_bench transformer bert_table allreduce ps_worker priority_pulls; do
  check "$s is 'skipped: no GPU'" grep -q "^| $s | skipped: no GPU" "$report"
done
for s in host pstrain_run ps_bench; do
  check "$s ran" grep -q "^| $s | ok |" "$report"
done
check "the host table records the kernel's TCP upper-layer protocols (kernel TLS needs 'tls')" \
  grep -Eq '^\| TCP upper-layer protocols \| [a-z]' "$report"
check "the host table names glibc and the cores" \
  bash -c "grep -q '^| glibc | glibc' '$report' && grep -q '^| CPU cores | [0-9]' '$report'"
check "pstrain_run has CPU rows with an accuracy and CUDA rows skipped" \
  bash -c "grep -Eq '^\| cpu \| lenet5 \| 2 \| 2 \| 64 \| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| 0\.[0-9]{4} \|' '$report' &&
           grep -q '^| cuda | lenet5 | 2 | 1 | - | - | - | skipped: no GPU' '$report'"
check "pstrain_run's fp16 checkpoint-and-resume row is skipped without a GPU" \
  grep -q '^| the resume line | skipped: no GPU |' "$report"
check "ps_bench timed 1 worker on 1, 2 and 4 shards, 1 and 4 channels, with no wrong element" \
  bash -c "for k in 1 2 4; do for c in 1 4; do grep -Eq \"^ +[0-9]+ +1 +\$k +\$c +pstrain .* 0\$\" '$report' || exit 1; done; done"
check "ps_bench timed the raw TLS baseline (OpenSSL on the sockets) beside raw TCP, every byte echoed back" \
  bash -c "grep -Eq '^ +[0-9]+ +1 +- +1 +raw TCP ' '$report' && grep -Eq '^ +[0-9]+ +1 +- +1 +raw TLS .* 0\$' '$report'"

echo "gpu_bundle_test: $((checks - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
