#!/usr/bin/env bash
# Installs what pstrain needs from Debian 12's packages (nothing else is
# downloaded) and builds every target (`--install_only`: installs, builds
# nothing; `--fuzz`: also clang-14 and libFuzzer for scripts/fuzz.sh, which
# the main build and CI do not need). Safe to run again: installs only what
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  bazel-bootstrap bazel-rules-java g++ git procps
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev
  zlib1g-dev dataset-fashion-mnist iproute2 libgloo-dev gnuplot-nox iperf3
  python3 patchelf xz-utils nlohmann-json3-dev libjpeg62-turbo-dev libpng-dev
  # text/: SentencePiece tokenizers, trained on fortune(6)'s English corpus.
  libsentencepiece-dev fortunes
  # tests/health_test: a Python client of gRPC's health and reflection.
  python3-grpcio python3-protobuf
  # tests/launcher_test.sh: a real Slurm (its own slurmctld and slurmd on
  # 127.0.0.1) and Open MPI's mpirun run README's cluster quick starts.
  munge slurmctld slurmd slurm-client openmpi-bin
  # tests/kubernetes_test.sh: parses the manifests and checks them against
  # the Kubernetes API's schema (python3-kubernetes' models), offline.
  python3-yaml python3-kubernetes
  # scripts/code_size.sh (in the test command): functions' line ranges.
  universal-ctags
)
install_only=0
for arg in "$@"; do
  case "$arg" in
    --install_only) install_only=1 ;;
    --fuzz) packages+=(clang-14 libfuzzer-14-dev llvm-14) ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
[ $install_only = 1 ] || bazel build //...
