#!/usr/bin/env bash
# Every GPU check of pstrain in one go, run on a GPU host from an unpacked
# bundle (scripts/gpu_bundle.sh puts this script at the bundle's root):
#
#   tar -xJf pstrain-gpu.tar.xz && bash gpu/gpu_check.sh OUT_DIR
#
# Sections, each under its own time limit (seconds, --quick in brackets):
#   host        GPU, driver, CUDA/cuDNN/cuBLAS/NCCL, glibc, cores       60
#   cuda_tests  tests/cuda_test (every layer and zoo model against the
#               CPU backend: a max abs/rel error table),
#               tests/cuda_transformer_test (the BERT layers, the MLM
#               loss and bert_tiny against the CPU backend, in fp32, bf16
#               and fp16), the NCCL tests of tests/collective_test, and
#               tests/precision_test (the CPU backend's bf16, which needs
#               this host's AVX-512)                                      240
#   train_bench train_bench --backend=cuda against PyTorch on the same
#               GPU in the same run (ResNet-50 224x224 batch 64 and 128,
#               batch 64 in fp32 (TF32 off) and with the update on the
#               host as a PS worker's step, batch 128 in bf16 and fp16
#               against PyTorch's autocast, ResNet-18 28x28x1 batch 64),
#               with a per-layer time table                               420
#   pstrain_run pstrain run --backend=cuda, sync PS with 1 and 2 workers
#               on the one GPU, LeNet-5 and ResNet-18 on Fashion-MNIST,
#               beside the same runs on the CPU backend; and fp16 LeNet-5
#               checkpointed, then resumed (the loss scale it restored)   420
#   transformer train_bench --backend=cuda --model=bert_base (the seeds'
#               third table's batch 96, 128 tokens, synthetic tokens,
#               TF32, then bf16 against PyTorch's autocast) against
#               PyTorch on the same GPU, with a per-layer time table;
#               and the PS worker on the GPU with it (sync, 1 worker,
#               2 shards on the host): fp32 and bf16 wires over mutual
#               TLS, and bert_base_untied with row-sparse embeddings      300
#   bert_table  the seeds' third table on this GPU: pstrain compare
#               --preset=bert --backend=cuda --batch_size=96 (sync PS
#               with row-sparse embeddings against Gloo allreduce, 1 and
#               2 workers sharing the GPU, 7 repeats a row)               480
#   allreduce   allreduce over NCCL with one rank, and Gloo between two
#               CUDA workers                                              180
#   ps_worker   the PS worker on the GPU: pstrain run --backend=cuda,
#               ResNet-50 on synthetic 224x224, 1 worker, 2 shards on the
#               host, batch 64, with the wire in fp32 and bf16, over mutual
#               TLS and plaintext, 1 and 4 channels per shard (compute and
#               exchange ms per step)                                     300
#   ps_bench    PS push+pull against raw TCP on loopback, 1, 2, 4 shards,
#               1 and 4 channels per shard, fp32 and bf16; then mTLS on 1
#               and 2 shards, 4 and 8 channels (CPU against its floor, and
#               against OpenSSL's own TLS on raw sockets at 1, 4 and 8
#               connections: is gRPC's TLS or TLS itself the limit here);
#               then 4 workers on 1 and 2 shards, plaintext fp32 and
#               bf16, with one malloc arena and with one per thread       300
#   priority_pulls
#               the early forward on CUDA (issue 39 item 4): LeNet-5, sync
#               PS, 2 workers on the GPU, 2 shards, 200 steps with and
#               without --priority_pulls; the same seed gives the same
#               model, so the accuracy and loss must match exactly       180
# Without a GPU (or with --dry_run) the GPU parts are marked "skipped: no
# GPU" and the rest runs. --quick shrinks every run (steps, bytes) to check
# the script itself (tests/gpu_bundle_test.sh). --only=a,b runs those
# sections, replacing only those in OUT_DIR's report (the device machine
# allows 10 minutes a command: split the check there, same OUT_DIR).
#
# Whatever happens, OUT_DIR gets gpu_report.md and gpu_report.json with what
# was measured so far (one entry per section: status, seconds, tables), and
# logs/ with every command's output. Exit 0 when no section failed, 1 when
# one did, 2 for bad arguments.
#
# The NVIDIA libraries come from this host: PyTorch's nvidia-* Python
# packages (found through python3), then /usr/local/cuda and
# /usr/local/nvidia; the rest is in the bundle's lib/.
set -uo pipefail

usage="usage: gpu_check.sh [--quick] [--dry_run] [--only=host,cuda_tests,train_bench,transformer,bert_table,pstrain_run,allreduce,ps_worker,ps_bench,priority_pulls] OUT_DIR"
all_sections="host cuda_tests train_bench transformer bert_table pstrain_run allreduce ps_worker ps_bench priority_pulls"
command_line="gpu_check.sh $*"
quick=0
dry_run=0
only=""
out=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --dry_run) dry_run=1 ;;
    --only=*) only="${arg#*=}" ;;
    -*) echo "gpu_check: unknown flag '$arg'; $usage" >&2; exit 2 ;;
    *)
      if [ -n "$out" ]; then
        echo "gpu_check: one output folder expected, got '$out' and '$arg'; $usage" >&2
        exit 2
      fi
      out="$arg"
      ;;
  esac
done
if [ -z "$out" ]; then
  echo "gpu_check: no output folder given; $usage" >&2
  exit 2
fi
for s in ${only//,/ }; do
  if ! [[ " $all_sections " == *" $s "* ]]; then
    echo "gpu_check: --only: unknown section '$s'; expected some of: $all_sections" >&2
    exit 2
  fi
done
root=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$root/cli/pstrain" ]; then
  echo "gpu_check: $root/cli/pstrain not found: run gpu_check.sh from an" \
    "unpacked bundle (bash scripts/gpu_bundle.sh makes dist/gpu)" >&2
  exit 2
fi
mkdir -p "$out/logs" || exit 2
out=$(cd "$out" && pwd)
data="$root/data/fashion-mnist"
python=$(command -v python3 || true)
# A full run starts the report afresh; --only replaces its sections' rows
# in OUT_DIR's report and keeps the others, so runs split over several
# commands add up to one report.
if [ -z "$only" ] || [ ! -f "$out/sections.tsv" ]; then
  : > "$out/sections.tsv"
else
  awk -F'\t' -v only=",$only," 'index(only, "," $1 ",") == 0' \
    "$out/sections.tsv" > "$out/sections.tsv.new" &&
    mv "$out/sections.tsv.new" "$out/sections.tsv"
fi

# --- NVIDIA libraries from the host --------------------------------------
nv_dirs=()
if [ -n "$python" ]; then
  while read -r d; do
    [ -n "$d" ] && nv_dirs+=("$d")
  done < <("$python" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
seen = []
for r in roots:
    for f in sorted(glob.glob(os.path.join(r, "**", "lib*.so*"), recursive=True)):
        d = os.path.dirname(f)
        if d not in seen:
            seen.append(d)
print("\n".join(seen))
EOF
)
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
  [ -d "$d" ] && nv_dirs+=("$d")
done
nv_path=$(IFS=:; echo "${nv_dirs[*]}")
export LD_LIBRARY_PATH="${nv_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

gpu=0
gpu_reason="no GPU"
if [ "$dry_run" = 1 ]; then
  gpu_reason="no GPU (--dry_run)"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  gpu=1
fi
cores=$(nproc)

# --- sections --------------------------------------------------------------
wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# record NAME STATUS SECONDS: one row of sections.tsv.
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$out/sections.tsv"; }

# run_section NAME LIMIT_S FUNCTION: runs FUNCTION (which writes
# $out/NAME.md) under LIMIT_S seconds, output in logs/NAME.log.
run_section() {
  local name=$1 limit=$2 fn=$3 start rc status
  wanted "$name" || return 0
  echo "gpu_check: $name (limit ${limit} s)"
  start=$(date +%s)
  export -f "$fn"
  timeout --kill-after=10 "$limit" bash -c "$fn" > "$out/logs/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="timeout after ${limit} s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  record "$name" "$status" "$(( $(date +%s) - start ))"
  echo "gpu_check: $name: $status"
  report
}

skip_section() {
  wanted "$1" || return 0
  echo "| $1 | skipped: $gpu_reason |" > "$out/$1.md"
  record "$1" "skipped: $gpu_reason" 0
  echo "gpu_check: $1: skipped: $gpu_reason"
}

# Steps and sizes of every run; --quick shrinks them.
run_models="lenet5 resnet18"
if [ "$quick" = 1 ]; then
  run_models="lenet5"  # a ResNet-18 evaluation takes minutes on 2 cores
  bench_steps=3; lenet_args="--epochs=1 --max_steps_per_epoch=20"
  resnet_args="--epochs=1 --max_steps_per_epoch=3 --batch_size=16"
  ps_bench_args="--model_bytes=8000000 --tensor_bytes=1000000 --repeats=2"
else
  bench_steps=30; lenet_args="--epochs=2"
  resnet_args="--epochs=1 --max_steps_per_epoch=300"
  ps_bench_args="--repeats=5"
fi
export root out data python cores gpu bench_steps lenet_args resnet_args \
  ps_bench_args run_models

host_section() {
  row() { printf '| %s | %s |\n' "$1" "$2"; }
  # The versions the libraries on LD_LIBRARY_PATH report themselves, and
  # where the worker binary finds each.
  libversions() {
    [ -n "$python" ] || { echo "| NVIDIA libraries | no python3 to ask them |"; return; }
    "$python" - <<'EOF'
import ctypes
def lib(name):
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None
v = ctypes.c_int()
rows = []
rt = lib("libcudart.so.13")
if rt and rt.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
    rows.append(("cudart", "%d.%d" % (v.value // 1000, v.value % 1000 // 10)))
    if rt.cudaDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
        rows.append(("CUDA (driver API)", "%d.%d" % (v.value // 1000, v.value % 1000 // 10)))
    else:
        rows.append(("CUDA (driver API)", "no driver"))
else:
    rows.append(("cudart", "libcudart.so.13 not found"))
cublas = lib("libcublas.so.13")
if cublas:
    parts = []
    for p in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        cublas.cublasGetProperty(p, ctypes.byref(v))
        parts.append(str(v.value))
    rows.append(("cuBLAS", ".".join(parts)))
else:
    rows.append(("cuBLAS", "libcublas.so.13 not found"))
cudnn = lib("libcudnn.so.9")
if cudnn:
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    n = cudnn.cudnnGetVersion()
    rows.append(("cuDNN", "%d.%d.%d" % (n // 10000, n % 10000 // 100, n % 100)))
else:
    rows.append(("cuDNN", "libcudnn.so.9 not found"))
nccl = lib("libnccl.so.2")
if nccl and nccl.ncclGetVersion(ctypes.byref(v)) == 0:
    n = v.value
    rows.append(("NCCL", "%d.%d.%d" % (n // 10000, n % 10000 // 100, n % 100)))
else:
    rows.append(("NCCL", "libnccl.so.2 not found"))
for name, value in rows:
    print("| %s | %s |" % (name, value))
EOF
    ldd "$root/worker/pstrain_worker" | awk '/cudart|cublas\.|cudnn\.|nccl/ {printf "| loads %s | %s |\n", $1, $3}'
  }
  {
    echo "| what | value |"
    echo "|---|---|"
    if command -v nvidia-smi >/dev/null; then
      row GPU "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)"
      row "driver" "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
      row "CUDA (driver)" "$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
    else
      row GPU "none (no nvidia-smi)"
    fi
    libversions
    if [ -n "$python" ]; then
      row PyTorch "$("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "")' 2>&1 | tail -1)"
    fi
    row glibc "$(getconf GNU_LIBC_VERSION)"
    row "CPU cores" "$cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1))"
    row memory "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    row kernel "$(uname -r)"
    # Kernel TLS (a route to mTLS without gRPC's TLS copies) needs the
    # kernel's `tls` upper-layer protocol; this records whether it is there.
    row "TCP upper-layer protocols" "$(cat /proc/sys/net/ipv4/tcp_available_ulp 2>/dev/null || echo unknown)"
    row bundle "$(head -1 "$root/BUNDLE_INFO" 2>/dev/null)"
    row "NVIDIA library path" "${LD_LIBRARY_PATH:-none}"
  } > "$out/host.md"
  cat "$out/host.md"
}

cuda_tests_section() {
  local rc=0
  PSTRAIN_LAYER_ERRORS="$out/layer_errors.md" "$root/tests/cuda_test" 2>&1 | tee "$out/logs/cuda_test.out"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  "$root/tests/cuda_transformer_test" 2>&1 | tee "$out/logs/cuda_transformer_test.out"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  "$root/tests/collective_test" --gtest_filter='Nccl*' 2>&1 | tee "$out/logs/collective_test.out"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  "$root/tests/precision_test" 2>&1 | tee "$out/logs/precision_test.out"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  {
    echo "| binary | passed | failed | skipped |"
    echo "|---|---:|---:|---:|"
    # gtest's closing counts ("[  PASSED  ] 2 tests.", "[  FAILED  ] 1
    # test, listed below:"), then the failed and skipped tests by name.
    count() {
      local n
      n=$(sed -n "s/^\[  $1 *\] \([0-9]*\) tests*[,.].*/\1/p" "$2" | tail -1)
      echo "${n:-0}"
    }
    for t in cuda_test cuda_transformer_test collective_test precision_test; do
      f="$out/logs/$t.out"
      printf '| %s | %s | %s | %s |\n' "$t" "$(count PASSED "$f")" \
        "$(count FAILED "$f")" "$(count SKIPPED "$f")"
    done
    for t in cuda_test cuda_transformer_test collective_test precision_test; do
      awk -v t="$t" '/^\[  (FAILED|SKIPPED) *\] [0-9]+ tests?, listed below/ {list = $0 ~ /FAILED/ ? "failed" : "skipped"; next}
        list != "" && /^\[  (FAILED|SKIPPED) *\] [A-Za-z]/ {line = $0; sub(/^\[[^]]*\] /, "", line); print "- " t " " list ": " line}' "$out/logs/$t.out"
    done
    if [ "$(count PASSED "$out/logs/cuda_test.out")" = 0 ]; then
      echo "- cuda_test passed no test: the GPU checks did not run"
    fi
    if [ -s "$out/layer_errors.md" ]; then
      echo
      cat "$out/layer_errors.md"
    fi
    if grep -q 'largest GPU-CPU difference' "$out/logs/cuda_transformer_test.out"; then
      echo
      echo "Transformer layers and bert_tiny, TF32 off, then bf16 and fp16 (cuda_transformer_test):"
      echo
      sed -n 's/^\(.*\(largest GPU-CPU difference\|worst gradient\|relative L2 from\).*\)$/- \1/p' \
        "$out/logs/cuda_transformer_test.out"
    fi
    if grep -q 'relative L2 from' "$out/logs/precision_test.out"; then
      echo
      echo "The CPU backend's bf16 transformer (precision_test):"
      echo
      sed -n 's/^\(.*\(relative L2 from\|worst gradient\).*\)$/- \1/p' \
        "$out/logs/precision_test.out"
    fi
    if grep -q 'worst gradient' "$out/logs/cuda_test.out"; then
      echo
      echo "Whole models, TF32 off (CudaTest.WholeModelsMatchTheCpuBackend):"
      echo
      sed -n 's/^\(.*worst gradient.*\)$/- \1/p' "$out/logs/cuda_test.out"
    fi
  } > "$out/cuda_tests.md"
  grep -q '^- cuda_test passed no test' "$out/cuda_tests.md" && rc=1
  return $rc
}

train_bench_section() {
  local rc=0 first=1 config
  : > "$out/train_bench.md"
  for config in \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=64 --layer_times" \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=128" \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=64 --precision=fp32" \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=128 --precision=bf16" \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=128 --precision=fp16" \
    "--model=resnet50 --dataset=synthetic --image_size=224 --num_classes=1000 --batch_size=64 --update=host" \
    "--model=resnet18 --dataset=fashion_mnist --data_dir=$data --batch_size=64"; do
    # shellcheck disable=SC2086
    "$root/bench/train_bench" --backend=cuda $config --steps="$bench_steps" \
      --warmup=5 --compare_pytorch --python="${python:-python3}" \
      > "$out/logs/train_bench.out" 2>&1 || rc=1
    cat "$out/logs/train_bench.out"
    if [ $first = 1 ]; then
      grep '^|' "$out/logs/train_bench.out" | head -2 >> "$out/train_bench.md"
    fi
    if ! grep '^| resnet' "$out/logs/train_bench.out" >> "$out/train_bench.md"; then
      echo "| failed: $(tail -1 "$out/logs/train_bench.out") |" >> "$out/train_bench.md"
    fi
    # The per-layer table of the first configuration, after the rows.
    if [ $first = 1 ]; then
      sed -n '/^Per-layer/,$p' "$out/logs/train_bench.out" > "$out/layer_times.md"
    fi
    first=0
  done
  if [ -s "$out/layer_times.md" ]; then
    { echo; cat "$out/layer_times.md"; } >> "$out/train_bench.md"
  fi
  return $rc
}

# BERT-base through train_bench against PyTorch (issue 41): the seeds'
# third table's setting, batch 96 of 128 synthetic tokens, TF32.
transformer_section() {
  local rc=0
  "$root/bench/train_bench" --backend=cuda --model=bert_base \
    --dataset=synthetic_tokens --batch_size=96 --steps="$bench_steps" \
    --warmup=3 --layer_times --compare_pytorch --python="${python:-python3}" \
    > "$out/logs/train_bench_bert.out" 2>&1 || rc=1
  cat "$out/logs/train_bench_bert.out"
  # bf16: the encoder's projections on 16-bit tensor cores, against
  # PyTorch's autocast.
  "$root/bench/train_bench" --backend=cuda --model=bert_base \
    --dataset=synthetic_tokens --batch_size=96 --steps="$bench_steps" \
    --warmup=3 --precision=bf16 --compare_pytorch \
    --python="${python:-python3}" \
    > "$out/logs/train_bench_bert_bf16.out" 2>&1 || rc=1
  cat "$out/logs/train_bench_bert_bf16.out"
  {
    grep '^|' "$out/logs/train_bench_bert.out" | head -2
    grep '^| bert' "$out/logs/train_bench_bert.out" ||
      echo "| failed: $(tail -1 "$out/logs/train_bench_bert.out") |"
    grep '^| bert' "$out/logs/train_bench_bert_bf16.out" ||
      echo "| failed (bf16): $(tail -1 "$out/logs/train_bench_bert_bf16.out") |"
    echo
    sed -n '/^Per-layer/,$p' "$out/logs/train_bench_bert.out"
    echo
    echo "| model | options | #PS | #Workers | Batchsize | Steps | Throughput (data/sec) | compute (ms/step) | exchange (ms/step) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } > "$out/transformer.md"
  local steps=20 model options json
  [ "$quick" = 1 ] && steps=2
  for config in "bert_base:" "bert_base:--wire_dtype=bf16" \
    "bert_base_untied:--sparse_embeddings"; do
    model=${config%%:*}
    options=${config#*:}
    json="$out/logs/transformer_${model}_${options//[^a-z0-9]/_}.json"
    echo "== pstrain run --backend=cuda --model=$model $options"
    # shellcheck disable=SC2086
    if "$root/cli/pstrain" run --backend=cuda --model="$model" \
      --dataset=synthetic_tokens --synthetic_samples=$((steps * 96)) \
      --batch_size=96 --num_workers=1 --num_ps=2 --mode=sync --epochs=1 \
      $options --results_json="$json"; then
      echo "| $model | ${options:-default (mTLS, fp32)} $(result_row "$json" '| %d | %d | %d | %d | %.1f | %.6f | %.6f |' \
        num_ps num_workers batch_size steps throughput_samples_per_sec \
        compute_seconds_per_step exchange_seconds_per_step)" >> "$out/transformer.md"
    else
      rc=1
      echo "| $model | $options | 2 | 1 | 96 | - | failed | - | - |" >> "$out/transformer.md"
    fi
  done
  # Seconds per step to milliseconds in the PS table's last two columns.
  awk -F'|' 'BEGIN {OFS="|"} $2 ~ /bert/ && NF == 11 && $9 ~ /[0-9]/ {$9 = sprintf(" %.1f ", $9 * 1000); $10 = sprintf(" %.1f ", $10 * 1000)} {print}' \
    "$out/transformer.md" > "$out/transformer.md.new" && mv "$out/transformer.md.new" "$out/transformer.md"
  return $rc
}

# The seeds' BERT table (issue 41) on this GPU: `pstrain compare
# --preset=bert` at the table's batch 96; its report's tables go into the
# section (gnuplot is not on a GPU host: no plot).
bert_table_section() {
  local args="--steps=4"
  [ "$quick" = 1 ] && args="--steps=1 --repeats=1"
  # shellcheck disable=SC2086
  "$root/cli/pstrain" compare --preset=bert --backend=cuda --batch_size=96 \
    $args --noplot --out_dir="$out/logs/bert_table" \
    > "$out/logs/bert_table.out" 2>&1
  local rc=$?
  tail -40 "$out/logs/bert_table.out"
  if [ -s "$out/logs/bert_table/results.md" ]; then
    sed -n '/^\*\*/,$p' "$out/logs/bert_table/results.md" > "$out/bert_table.md"
  else
    echo "| failed: $(tail -1 "$out/logs/bert_table.out") |" > "$out/bert_table.md"
  fi
  return $rc
}

# result_row RESULTS_JSON FORMAT FIELD...: FORMAT (Python %-style) applied
# to those fields of a RunResult that `pstrain run --results_json` wrote
# (int64 fields arrive as strings there).
result_row() {
  "$python" - "$@" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
values = [r[k] for k in sys.argv[3:]]
print(sys.argv[2] % tuple(int(v) if isinstance(v, str) and v.isdigit() else v
                          for v in values))
EOF
}
export -f result_row

pstrain_run_section() {
  local rc=0 backend model workers args json
  {
    echo "| backend | model | #PS | #Workers | Batchsize | Steps | Runtime (s) | Throughput (data/sec) | Test accuracy |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } > "$out/pstrain_run.md"
  for model in $run_models; do
    for backend in cuda cpu; do
      for workers in 1 2; do
        if [ "$backend" = cuda ] && [ "$gpu" != 1 ]; then
          echo "| $backend | $model | 2 | $workers | - | - | - | skipped: no GPU | - |" >> "$out/pstrain_run.md"
          continue
        fi
        args=$lenet_args
        [ "$model" = resnet18 ] && args=$resnet_args
        json="$out/logs/run_${model}_${backend}_${workers}.json"
        echo "== pstrain run --backend=$backend --model=$model --num_workers=$workers $args"
        # shellcheck disable=SC2086
        if "$root/cli/pstrain" run --backend="$backend" --model="$model" \
          --dataset=fashion_mnist --data_dir="$data" --num_ps=2 \
          --num_workers="$workers" --mode=sync $args --results_json="$json"; then
          echo "| $backend $(result_row "$json" '| %s | %d | %d | %d | %d | %.2f | %.1f | %.4f |' \
            model num_ps num_workers batch_size steps runtime_seconds \
            throughput_samples_per_sec test_accuracy)" >> "$out/pstrain_run.md"
        else
          rc=1
          echo "| $backend | $model | 2 | $workers | - | - | - | failed | - |" >> "$out/pstrain_run.md"
        fi
      done
    done
  done
  fp16_resume_rows || rc=1
  return $rc
}

# fp16's loss scale through a checkpoint: LeNet-5 for 120 steps with a
# checkpoint every 50, then --resume of the same run from step 100; the
# resume line names the scale the manifest held (worker/checkpoint.h,
# "loss_scaler"), GradScaler's 65536 unless a step overflowed.
fp16_resume_rows() {
  local dir="$out/logs/fp16_checkpoints" line flags
  {
    echo
    echo "| fp16 checkpoint, then --resume (cuda, lenet5, 120 steps) | result |"
    echo "|---|---|"
  } >> "$out/pstrain_run.md"
  if [ "$gpu" != 1 ]; then
    echo "| the resume line | skipped: no GPU |" >> "$out/pstrain_run.md"
    return 0
  fi
  rm -rf "$dir" "$out/logs/fp16_first.out" "$out/logs/fp16_resume.out"
  flags="--backend=cuda --precision=fp16 --model=lenet5 --dataset=fashion_mnist
    --data_dir=$data --num_ps=2 --num_workers=1 --epochs=1
    --max_steps_per_epoch=120 --checkpoint_every_steps=50 --checkpoint_dir=$dir"
  echo "== pstrain run $flags, then --resume"
  # shellcheck disable=SC2086
  if "$root/cli/pstrain" run $flags > "$out/logs/fp16_first.out" 2>&1 &&
    "$root/cli/pstrain" run $flags --resume > "$out/logs/fp16_resume.out" 2>&1 &&
    line=$(grep -m1 -o 'Resuming from .*loss scale [0-9.e+]*)' "$out/logs/fp16_resume.out"); then
    echo "| the resume line | $line |" >> "$out/pstrain_run.md"
    return 0
  fi
  local last="$out/logs/fp16_resume.out"
  [ -s "$last" ] || last="$out/logs/fp16_first.out"
  echo "| the resume line | failed: $(tail -1 "$last") |" >> "$out/pstrain_run.md"
  return 1
}
export -f fp16_resume_rows

allreduce_section() {
  local rc=0
  local nccl_error="" gloo_error=""
  echo "== allreduce over NCCL, one rank"
  "$root/cli/pstrain" compare --backend=cuda --model=lenet5 \
    --dataset=fashion_mnist --data_dir="$data" --workers=1 \
    --modes=allreduce_nccl --steps=100 --out_dir="$out/logs/allreduce_nccl" \
    --plot="$(command -v gnuplot >/dev/null && echo true || echo false)" \
    2>&1 | tee "$out/logs/allreduce_nccl.out"
  [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; nccl_error=$(tail -1 "$out/logs/allreduce_nccl.out"); }
  echo "== allreduce over Gloo, two CUDA workers"
  # shellcheck disable=SC2086
  "$root/cli/pstrain" run --backend=cuda --model=lenet5 --mode=allreduce \
    --dataset=fashion_mnist --data_dir="$data" --num_workers=2 $lenet_args \
    --results_json="$out/logs/allreduce_gloo.json" 2>&1 | tee "$out/logs/allreduce_gloo.out"
  [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; gloo_error=$(tail -1 "$out/logs/allreduce_gloo.out"); }
  {
    echo "NCCL, one rank (pstrain compare --modes=allreduce_nccl --workers=1):"
    echo
    if [ -n "$nccl_error" ]; then
      echo "failed: $nccl_error"
    else
      grep '^|' "$out/logs/allreduce_nccl/results.md" 2>/dev/null | head -3
    fi
    echo
    echo "Gloo, two CUDA workers:"
    echo
    if [ -n "$gloo_error" ]; then
      echo "failed: $gloo_error"
    elif [ -s "$out/logs/allreduce_gloo.json" ]; then
      echo "| #Workers | Steps | Throughput (data/sec) | Test accuracy |"
      echo "|---:|---:|---:|---:|"
      result_row "$out/logs/allreduce_gloo.json" '| %d | %d | %.1f | %.4f |' \
        num_workers steps throughput_samples_per_sec test_accuracy
    else
      echo "(no results)"
    fi
  } > "$out/allreduce.md"
  return $rc
}

ps_worker_section() {
  local rc=0 wire tls ch json steps=100 samples
  [ "$quick" = 1 ] && steps=5
  samples=$((steps * 64))
  {
    echo "| wire | transport | channels per shard | #PS | #Workers | Batchsize | Steps | Throughput (data/sec) | compute (ms/step) | exchange (ms/step) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  } > "$out/ps_worker.md"
  # wire:transport:channels per shard
  for config in fp32:mtls:1 fp32:mtls:4 fp32:plaintext:1 fp32:plaintext:4 \
    bf16:mtls:4 bf16:plaintext:1; do
    IFS=: read -r wire tls ch <<< "$config"
    json="$out/logs/ps_worker_${wire}_${tls}_${ch}.json"
    echo "== pstrain run --backend=cuda --model=resnet50 --wire_dtype=$wire --channels_per_shard=$ch ($tls)"
    # shellcheck disable=SC2046
    if "$root/cli/pstrain" run --backend=cuda --model=resnet50 \
      --dataset=synthetic --image_size=224 --num_classes=1000 \
      --synthetic_samples="$samples" --batch_size=64 --num_workers=1 \
      --num_ps=2 --mode=sync --epochs=1 --wire_dtype="$wire" \
      --channels_per_shard="$ch" \
      $([ "$tls" = plaintext ] && echo --insecure) --results_json="$json"; then
      echo "| $wire | $tls | $ch $(result_row "$json" '| %d | %d | %d | %d | %.1f | %.6f | %.6f |' \
        num_ps num_workers batch_size steps throughput_samples_per_sec \
        compute_seconds_per_step exchange_seconds_per_step)" >> "$out/ps_worker.md"
    else
      rc=1
      echo "| $wire | $tls | $ch | 2 | 1 | 64 | - | failed | - | - |" >> "$out/ps_worker.md"
    fi
  done
  # Seconds per step to milliseconds in the table's last two columns.
  awk -F'|' 'BEGIN {OFS="|"} NR > 2 && $10 ~ /[0-9]/ {$10 = sprintf(" %.1f ", $10 * 1000); $11 = sprintf(" %.1f ", $11 * 1000)} {print}' \
    "$out/ps_worker.md" > "$out/ps_worker.md.new" && mv "$out/ps_worker.md.new" "$out/ps_worker.md"
  return $rc
}

# Priority pulls' early forward on the GPU: each layer's weights copied to
# the device once its pull is in (Model::set_weights_gate). The same seed
# with and without gives the same model bit for bit (sync mode), so the
# accuracy and test loss must be equal; the throughputs are beside them.
priority_pulls_section() {
  local steps=200 on
  [ "$quick" = 1 ] && steps=10
  for on in false true; do
    echo "== pstrain run --backend=cuda --model=lenet5 --priority_pulls=$on"
    rm -f "$out/logs/priority_pulls_$on.json"
    "$root/cli/pstrain" run --backend=cuda --model=lenet5 \
      --dataset=fashion_mnist --data_dir="$data" --num_ps=2 --num_workers=2 \
      --mode=sync --epochs=1 --max_steps_per_epoch="$steps" \
      --priority_pulls="$on" --results_json="$out/logs/priority_pulls_$on.json"
  done
  # The table, and exit 0 only when both ran and ended alike.
  "$python" - "$out/logs/priority_pulls_false.json" \
    "$out/logs/priority_pulls_true.json" > "$out/priority_pulls.md" <<'PY'
import json, os, sys
print("| priority pulls | #PS | #Workers | Steps | Throughput (data/sec) | Test accuracy | Test loss |")
print("|---|---:|---:|---:|---:|---:|---:|")
runs = []
for on, path in zip(("false", "true"), sys.argv[1:]):
    if not os.path.exists(path):
        print(f"| {on} | 2 | 2 | - | failed | - | - |")
        continue
    r = json.load(open(path))
    loss = r["epoch_results"][-1]["test_loss"]
    runs.append((r["test_accuracy"], loss))
    print(f"| {on} | {r['num_ps']} | {r['num_workers']} | {r['steps']} | "
          f"{r['throughput_samples_per_sec']:.1f} | {r['test_accuracy']:.4f} | {loss!r} |")
same = len(runs) == 2 and runs[0] == runs[1]
print()
print("Same model with and without:", "yes" if same else "no")
sys.exit(0 if same else 1)
PY
}

ps_bench_section() {
  # shellcheck disable=SC2086
  "$root/bench/ps_bench" --shards=1,2,4 --channels_per_shard=1,4 \
    --wire_dtypes=bf16 $ps_bench_args > "$out/logs/ps_bench.out" 2>&1
  local rc=$?
  # Mutual TLS with 4 and 8 channels: its CPU against the floor the
  # cipher's own speed allows (the CPU, cores and TLS floor columns) on a
  # many-core host, and the raw TLS rows (OpenSSL straight on 1, 4 and 8
  # sockets): on 2 cores they reach 0.44-0.48x of raw TCP, no more than gRPC's mTLS
  # against its plaintext; if they reach 0.95x here, a data plane on
  # OpenSSL would meet issue 39 item 1 where gRPC's TLS does not.
  # shellcheck disable=SC2086
  "$root/bench/ps_bench" --shards=1,2 --channels_per_shard=4,8 \
    --wire_dtypes= --compressions= $ps_bench_args \
    >> "$out/logs/ps_bench.out" 2>&1 || rc=$?
  # Four workers on the shards, plaintext: the shards' aggregation and
  # the 16-bit replies shared by every worker (0.47-0.55x of four raw TCP
  # connections on 2 cores, where both ends share them); then the same
  # with an arena per thread, since common/malloc_tuning.h's one arena
  # puts every thread's allocations behind one lock (2.03x faster than
  # the thresholds alone on 2 cores, unmeasured on many).
  local one_arena
  for one_arena in true false; do
    echo "# --malloc_one_arena=$one_arena" >> "$out/logs/ps_bench.out"
    # shellcheck disable=SC2086
    "$root/bench/ps_bench" --workers=4 --shards=1,2 --channels_per_shard=4 \
      --tls=false --wire_dtypes=bf16 --compressions= \
      --malloc_one_arena=$one_arena $ps_bench_args \
      >> "$out/logs/ps_bench.out" 2>&1 || rc=$?
  done
  cat "$out/logs/ps_bench.out"
  { echo '```'; cat "$out/logs/ps_bench.out"; echo '```'; } > "$out/ps_bench.md"
  return $rc
}
# --- the report (rewritten after every section) ---------------------------
report() {
  {
    echo "# pstrain GPU check"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), bundle: $(head -1 "$root/BUNDLE_INFO" 2>/dev/null)"
    echo "Command: $command_line"
    echo
    echo "| section | status | seconds |"
    echo "|---|---|---:|"
    awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}' "$out/sections.tsv"
    while IFS=$'\t' read -r name _ _; do
      echo
      echo "## $name"
      echo
      cat "$out/$name.md" 2>/dev/null || echo "(no output: see logs/$name.log)"
    done < "$out/sections.tsv"
  } > "$out/gpu_report.md"
  if [ -n "$python" ]; then
    "$python" - "$out" <<'EOF' || echo "gpu_check: could not write gpu_report.json" >&2
import json, os, sys
out = sys.argv[1]

def tables(text):
    """Markdown tables as lists of {column: cell} rows."""
    result, header = [], None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                result.append([])
            elif not all(set(c) <= set("-:") for c in cells):
                result[-1].append(dict(zip(header, cells)))
        else:
            header = None
    return [t for t in result if t]

sections = []
for line in open(os.path.join(out, "sections.tsv")):
    name, status, seconds = line.rstrip("\n").split("\t")
    md = os.path.join(out, name + ".md")
    text = open(md).read() if os.path.exists(md) else ""
    sections.append({"section": name, "status": status, "seconds": int(seconds),
                     "tables": tables(text), "log": "logs/%s.log" % name})
json.dump({"sections": sections}, open(os.path.join(out, "gpu_report.json"), "w"), indent=1)
EOF
  fi
}
trap report EXIT

# --- run -----------------------------------------------------------------
echo "gpu_check: bundle $root, output $out, GPU: $([ $gpu = 1 ] && echo yes || echo "$gpu_reason"), quick: $quick"
run_section host 60 host_section
if [ "$gpu" = 1 ]; then
  run_section cuda_tests 240 cuda_tests_section
  run_section train_bench 420 train_bench_section
  run_section transformer 300 transformer_section
  run_section bert_table 480 bert_table_section
else
  skip_section cuda_tests
  skip_section train_bench
  skip_section transformer
  skip_section bert_table
fi
# CPU rows run without a GPU; the CUDA rows say "skipped: no GPU".
run_section pstrain_run 420 pstrain_run_section
if [ "$gpu" = 1 ]; then
  run_section allreduce 180 allreduce_section
  run_section ps_worker 300 ps_worker_section
else
  skip_section allreduce
  skip_section ps_worker
fi
run_section ps_bench 300 ps_bench_section
if [ "$gpu" = 1 ]; then
  run_section priority_pulls 180 priority_pulls_section
else
  skip_section priority_pulls
fi
report
if cut -f2 "$out/sections.tsv" | grep -qv -e '^ok$' -e '^skipped'; then
  echo "gpu_check: some sections failed; see $out/gpu_report.md"
  exit 1
fi
echo "gpu_check: done; see $out/gpu_report.md"
