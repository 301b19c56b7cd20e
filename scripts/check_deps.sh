#!/usr/bin/env bash
# Packages know only what they need (docs/ARCHITECTURE.md): the coordinator
# and the PS, their libraries and their binaries, depend on neither oneDNN
# nor the image codecs (libjpeg, libpng). Asks `bazel query` for a path from
# each to each; exits 1 naming every path found, 0 when there is none.
# scripts/test.sh runs it. Usage: bash scripts/check_deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
query() {
  if ! bazel query --noshow_progress --ui_event_filters=-info "$1" \
    2>"$log"; then
    cat "$log" >&2
    echo "check_deps: bazel query failed: $1" >&2
    exit 2
  fi
}

# Where the binaries live is looked up, so a move keeps them checked.
binaries='attr(name, "^pstrain_(ps|coordinator)$", kind("cc_binary", //...))'
found_binaries=$(query "$binaries")
if [ "$(echo "$found_binaries" | grep -c .)" != 2 ]; then
  echo "check_deps: expected the pstrain_ps and pstrain_coordinator" \
    "binaries; found: ${found_binaries:-none}" >&2
  exit 2
fi
froms=('//coordinator:all' '//server:all' "$binaries")
heavy=(//third_party:dnnl //third_party:jpeg //third_party:png)

found=0
for from in "${froms[@]}"; do
  for to in "${heavy[@]}"; do
    path=$(query "somepath(${from}, ${to})")
    if [ -n "$path" ]; then
      found=1
      echo "check_deps: ${from} depends on ${to}:" >&2
      echo "$path" | sed 's/^/  /' >&2
    fi
  done
done
if [ $found = 1 ]; then
  echo "check_deps: FAIL (the paths above; see docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check_deps: no path from the coordinator or the PS to oneDNN, libjpeg" \
  "or libpng"
