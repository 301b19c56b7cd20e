#!/usr/bin/env bash
# Builds pstrain's CUDA binaries (bazel build --config=cuda) and lays them
# out as one folder that runs on a GPU host without Bazel, gRPC or network:
#
#   dist/gpu/                      the bundle (--out)
#     cli/    pstrain               coordinator/ pstrain_coordinator
#     server/ pstrain_ps            worker/ pstrain_worker
#     bench/  train_bench ps_bench  tools/torch/ torch_bench.py torch_models.py
#     tests/  cuda_test cuda_transformer_test collective_test (CUDA tests),
#             precision_test (bf16 on the CPU: the GPU host has AVX-512)
#     lib/    every shared library the binaries need except glibc's and
#             NVIDIA's (gRPC, protobuf, Abseil, oneDNN, Gloo, libstdc++, ...),
#             found with the binaries through an $ORIGIN rpath
#     data/fashion-mnist/          Debian's dataset-fashion-mnist files
#     gpu_check.sh, BUNDLE_INFO
#   dist/pstrain-gpu.tar.xz        what travels to the GPU host
#
# The NVIDIA libraries (cudart, cuBLAS, cuDNN, NCCL, the driver) come from
# the GPU host: gpu_check.sh finds them in PyTorch's nvidia-* Python
# packages or /usr/local/cuda and sets LD_LIBRARY_PATH.
#
# Fails (exit 1) if a binary needs a library that is neither in lib/ nor
# glibc's nor NVIDIA's, or if the archive is over --max_mib (60) MiB.
# Exit 2: bad flag, or no CUDA toolkit in /usr/local/cuda.
#
#   bash scripts/gpu_bundle.sh [--out=dist/gpu] [--no_build] [--no_setup]
#       [--max_mib=60] [--data_dir=/usr/share/datasets/fashion-mnist]
# (--no_build: lay out what was built last; --no_setup: install nothing.)
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist/gpu
build=1
setup=1
max_mib=60
data_dir=/usr/share/datasets/fashion-mnist
for arg in "$@"; do
  case "$arg" in
    --out=*) out="${arg#*=}" ;;
    --no_build) build=0 ;;
    --no_setup) setup=0 ;;
    --max_mib=*) max_mib="${arg#*=}" ;;
    --data_dir=*) data_dir="${arg#*=}" ;;
    *)
      echo "gpu_bundle: unknown argument '$arg'; expected --out=DIR," \
        "--no_build, --no_setup, --max_mib=N or --data_dir=DIR" >&2
      exit 2
      ;;
  esac
done
if ! [[ "$max_mib" =~ ^[0-9]+$ ]]; then
  echo "gpu_bundle: --max_mib=$max_mib: expected a whole number of MiB" >&2
  exit 2
fi
if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu_bundle: /usr/local/cuda/bin/nvcc not found: the bundle needs the" \
    "CUDA toolkit (CUDA 13 with cuDNN 9, cuBLAS and NCCL) in /usr/local/cuda" >&2
  exit 2
fi

# Binaries and where the bundle puts them (bazel-bin relative).
binaries=(
  cli/pstrain coordinator/pstrain_coordinator bench/train_bench bench/ps_bench
  server/pstrain_ps worker/pstrain_worker
)
test_binaries=(models/cuda_test models/cuda_transformer_test worker/collective_test
  models/precision_test)
# What the GPU host provides (glibc's and NVIDIA's libraries).
source scripts/gpu_host_libs.sh  # host_lib_re

if [ "$build" = 1 ]; then
  [ "$setup" = 1 ] && bash scripts/setup.sh --install_only
  targets=()
  for b in "${binaries[@]}" "${test_binaries[@]}"; do
    targets+=("//${b%/*}:${b##*/}")
  done
  bazel build --config=cuda "${targets[@]}"
fi
bin=$(bazel info --config=cuda bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out"/{cli,coordinator,bench,tools/torch,server,worker,tests,lib}
mkdir -p "$out"/data/fashion-mnist
elves=()     # the bundle's binaries
sources=()   # each one's original, whose rpath finds Bazel's _solib
for b in "${binaries[@]}"; do
  install -m 755 "$bin/$b" "$out/$b"
  elves+=("$out/$b")
  sources+=("$bin/$b")
done
for b in "${test_binaries[@]}"; do
  install -m 755 "$bin/$b" "$out/tests/${b##*/}"
  elves+=("$out/tests/${b##*/}")
  sources+=("$bin/$b")
done
install -m 644 tools/torch/torch_bench.py tools/torch/torch_models.py \
  "$out/tools/torch/"
install -m 755 scripts/gpu_check.sh "$out/gpu_check.sh"
install -m 644 "$data_dir"/*-ubyte.gz "$out/data/fashion-mnist/"

# Every library the binaries load, except the host's: ldd gives the whole
# closure (Bazel's test binaries also load our own libraries from _solib).
declare -A copied=()
for e in "${sources[@]}"; do
  while read -r name path; do
    [[ "$name" =~ $host_lib_re ]] && continue
    if [ "$path" = "not" ]; then
      echo "gpu_bundle: $e needs $name, which is not found here" >&2
      exit 1
    fi
    [ -n "${copied[$name]:-}" ] && continue
    install -m 644 "$(readlink -f "$path")" "$out/lib/$name"
    copied[$name]=1
  done < <(env -u LD_LIBRARY_PATH ldd "$e" | awk '/=>/ {print $1, $3}')
done
for e in "${elves[@]}"; do
  strip --strip-unneeded "$e"
  patchelf --set-rpath '$ORIGIN/../lib' "$e"
done
for l in "$out"/lib/*; do
  chmod u+w "$l"
  patchelf --set-rpath '$ORIGIN' "$l"
done

# What the bundle was built from and against.
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "nvcc: $(/usr/local/cuda/bin/nvcc --version | tail -1)"
  echo "cudnn: $(awk '/define CUDNN_MAJOR|define CUDNN_MINOR|define CUDNN_PATCHLEVEL/ {printf "%s ", $3}' /usr/local/cuda/include/cudnn_version.h 2>/dev/null)"
  echo "nccl: $(awk '/define NCCL_MAJOR|define NCCL_MINOR|define NCCL_PATCH / {printf "%s ", $3}' /usr/local/cuda/include/nccl.h 2>/dev/null)"
  echo "host libraries expected: glibc >= $(ldd --version | head -1 | awk '{print $NF}'), the NVIDIA driver, libcudart/libcublas 13, libcudnn 9, libnccl 2"
} > "$out/BUNDLE_INFO"

# The bundle must resolve everything but glibc's and NVIDIA's libraries by
# itself (tests/gpu_bundle_test.sh checks the same).
bad=$(for e in "${elves[@]}"; do
  env -u LD_LIBRARY_PATH ldd "$e" | awk -v e="$e" '/not found/ {print e": "$1}'
done | grep -Ev ": $host_lib_re" || true)
if [ -n "$bad" ]; then
  echo "gpu_bundle: unresolved libraries:" >&2
  echo "$bad" >&2
  exit 1
fi

archive="$(dirname "$out")/pstrain-gpu.tar.xz"
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 > "$archive"
folder_bytes=$(du -sb "$out" | cut -f1)
archive_bytes=$(stat -c %s "$archive")
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "gpu_bundle: $out: $(mib "$folder_bytes") MiB unpacked; $archive: $(mib "$archive_bytes") MiB (limit ${max_mib} MiB)"
if [ "$archive_bytes" -gt $((max_mib * 1048576)) ]; then
  echo "gpu_bundle: $archive is $(mib "$archive_bytes") MiB, over the ${max_mib} MiB that may travel" >&2
  exit 1
fi
