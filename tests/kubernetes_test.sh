#!/bin/bash
# `pstrain launch-lines --launcher=kubernetes` without a cluster: renders the
# coordinator's and a 2 PS + 2 worker LeNet-5 job's manifests, checks each
# object against the Kubernetes schema of Debian's python3-kubernetes, and
# runs every pod's container (command, env, JOB_COMPLETION_INDEX, Secrets
# as the test's certificate folders, DNS names mapped to 127.0.0.1) as a
# local process until the job ends SUCCEEDED (tests/kubernetes_local.py).
# It has not run on a real cluster. Skips where Fashion-MNIST is missing.
#
# Run by hand: bash tests/kubernetes_test.sh [BIN_DIR]   (default: bazel-bin)
# or through Bazel: bazel test //tests:kubernetes_test.
set -u
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  BIN="$(pwd)"
  HERE="$(pwd)/tests"
else
  BIN="$(cd "${1:-bazel-bin}" && pwd)"
  HERE="$(cd "$(dirname "$0")" && pwd)"
fi
# Debian's python3, which has python3-yaml and python3-kubernetes.
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON=python3
exec timeout 120 "$PYTHON" "$HERE/kubernetes_local.py" "$BIN"
