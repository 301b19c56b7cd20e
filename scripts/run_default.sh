#!/usr/bin/env bash
# README's first command: install, build, and train LeNet-5 on Fashion-MNIST
# with 2 parameter-server shards and 2 CPU workers on this machine.
# Extra arguments go to `pstrain run` (e.g. --epochs=1 --mode=async).
#
# Builds only what the job runs: pstrain (with the coordinator in-process)
# and the pstrain_ps and pstrain_worker it starts; the data is Debian's
# dataset-fashion-mnist, installed by setup.sh. Tests and benchmarks are
# left to scripts/test.sh, which builds everything. Each stage prints a line
# when it starts and "<stage>: N s" when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(//cli:pstrain //server:pstrain_ps //worker:pstrain_worker)
stage_start=0

begin() {
  echo "== $1: $2"
  stage_start=$SECONDS
}

end() {
  echo "== $1: $((SECONDS - stage_start)) s"
}

begin install "Debian packages (scripts/setup.sh --install_only)"
bash scripts/setup.sh --install_only
end install

begin build "bazel build ${targets[*]} (offline; a fresh machine takes minutes)"
bazel build "${targets[@]}"
end build

begin train "bazel-bin/cli/pstrain run $*"
status=0
bazel-bin/cli/pstrain run "$@" || status=$?
end train
exit $status
