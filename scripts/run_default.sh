#!/usr/bin/env bash
# README's first command: set up, build, and train LeNet-5 on Fashion-MNIST
# with 2 parameter-server shards and 2 CPU workers on this machine.
# Extra arguments go to `pstrain run` (e.g. --epochs=1 --mode=async).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec bazel-bin/tools/pstrain run "$@"
