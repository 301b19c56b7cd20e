#!/bin/bash
# embedding_bench over emulated links (issue 41): every PS shard and worker
# on its own host (a network namespace, scripts/netns_hosts.sh), each host's
# link to the switch shaped by tc tbf in both directions, as
# scripts/emulated_links.sh does for `pstrain compare`.
#
#   bash bench/embedding_bench.sh [--link_mbit=1000] [--workers=2]
#        [--shards=2] [--modes=sparse_ps,allreduce] [--queue_ms=10]
#        [--bin=bazel-bin/bench/embedding_bench] [-- BENCH_FLAGS...]
#
# Hosts: 10.79.0.11.. the shards, 10.79.0.71.. the workers. Each mode is a
# fresh set of processes; worker 0's row is printed (the columns are in
# bench/embedding_bench.cc). Flags after -- go to every process (--rows,
# --dim, --batch, --bag, --steps, --warmup, --lr, --partition_bytes).
# Needs root (network namespaces, tc) and iproute2. Every host shares this
# machine's cores.
set -euo pipefail
# shellcheck source=scripts/netns_hosts.sh
source "$(dirname "$0")/../scripts/netns_hosts.sh"

LINK_MBIT=1000
QUEUE_MS=10
WORKERS=2
SHARDS=2
MODES=sparse_ps,allreduce
BIN=bazel-bin/bench/embedding_bench
EXTRA=()
while (($#)); do
  case "$1" in
    --link_mbit=*) LINK_MBIT="${1#*=}" ;;
    --queue_ms=*) QUEUE_MS="${1#*=}" ;;
    --workers=*) WORKERS="${1#*=}" ;;
    --shards=*) SHARDS="${1#*=}" ;;
    --modes=*) MODES="${1#*=}" ;;
    --bin=*) BIN="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
BIN="$(realpath "$BIN")"
TAG="eb$$"
SWITCH="${TAG}sw"
HOSTS=()
for ((i = 0; i < SHARDS; i++)); do HOSTS+=("p$i"); done
for ((i = 0; i < WORKERS; i++)); do HOSTS+=("w$i"); done
ip_of() {
  case "$1" in
    p*) echo "10.79.0.$((11 + ${1#p}))" ;;
    w*) echo "10.79.0.$((71 + ${1#w}))" ;;
  esac
}
ns_of() { echo "${TAG}$1"; }
STORE="$(mktemp -d)"
cleanup() {
  for h in "${HOSTS[@]}"; do netns_remove "$(ns_of "$h")"; done
  netns_remove "$SWITCH"
  rm -rf "$STORE" "$STORE".[pw]*
}
trap cleanup EXIT

shape() {  # shape NETNS DEV: tbf at LINK_MBIT, QUEUE_MS of queue
  local burst=$((LINK_MBIT * 1000000 / 8 / 250))  # 4 ms of traffic
  ((burst < 32000)) && burst=32000
  ip netns exec "$1" tc qdisc add dev "$2" root tbf \
    rate "${LINK_MBIT}mbit" burst "$burst" latency "${QUEUE_MS}ms"
}
netns_switch "$SWITCH"
for h in "${HOSTS[@]}"; do
  ns="$(ns_of "$h")"
  netns_host "$SWITCH" "$ns" "$(ip_of "$h")/24" "${TAG}$h"
  shape "$ns" eth0
  shape "$SWITCH" "${TAG}$h"
done
echo "# ${#HOSTS[@]} hosts, links ${LINK_MBIT} Mbit/s each way (tc tbf," \
  "${QUEUE_MS} ms queues), $(nproc) cores shared"

PS_ADDRESSES=""
for ((i = 0; i < SHARDS; i++)); do
  PS_ADDRESSES+="${PS_ADDRESSES:+,}$(ip_of "p$i"):7000"
done
IFS=, read -ra MODE_LIST <<<"$MODES"
for mode in "${MODE_LIST[@]}"; do
  PIDS=()
  if [[ "$mode" != allreduce ]]; then
    for ((i = 0; i < SHARDS; i++)); do
      ip netns exec "$(ns_of "p$i")" "$BIN" --role=ps --mode="$mode" \
        --listen="$(ip_of "p$i"):7000" --shards="$SHARDS" --shard_index="$i" \
        --workers="$WORKERS" "${EXTRA[@]}" >"$STORE.p$i" 2>&1 &
      PIDS+=($!)
    done
    for ((i = 0; i < SHARDS; i++)); do  # until each shard listens
      for ((t = 0; t < 300; t++)); do
        grep -qs listening "$STORE.p$i" && break
        sleep 0.1
      done
    done
  fi
  rm -rf "${STORE:?}"/*
  rm -f "$STORE".p*
  WPIDS=()
  for ((i = 0; i < WORKERS; i++)); do
    ip netns exec "$(ns_of "w$i")" "$BIN" --role=worker --mode="$mode" \
      --rank="$i" --workers="$WORKERS" --ps="$PS_ADDRESSES" \
      --host="$(ip_of "w$i")" --store_dir="$STORE" "${EXTRA[@]}" \
      >"$STORE.w$i" 2>&1 &
    WPIDS+=($!)
  done
  status=0
  for pid in "${WPIDS[@]}"; do wait "$pid" || status=1; done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status != 0)); then
    cat "$STORE".w* >&2
    rm -f "$STORE".w*
    exit 1
  fi
  if [[ "$mode" == "${MODE_LIST[0]}" ]]; then head -1 "$STORE.w0"; fi
  tail -n +2 "$STORE.w0"
  rm -f "$STORE".w* "$STORE".p*
done
