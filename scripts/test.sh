#!/usr/bin/env bash
# README's second command: set up, build, and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bazel test //...
