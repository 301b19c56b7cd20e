#!/bin/bash
# `pstrain compare` over emulated network links: every PS and worker on its
# own host (a network namespace), each host on its own link to a switch (a
# bridge in another namespace), each link shaped by tc in both directions.
#
#   bash scripts/emulated_links.sh [--link_mbit=1000] [--link_delay_ms=0]
#        [--workers=4] [--num_ps=2,4] [--modes=ps_sync,allreduce]
#        [--compute_ms=100] [--model_bytes=102228128] [--steps=10]
#        [--batch_size=32] [--partition_bytes=4194304] [--out_dir=DIR]
#        [--bin=bazel-bin]   (env QUEUE_MS=10: each shaped queue, ms)
#
# Hosts: 10.78.0.1 runs `pstrain compare` and its coordinator (its link is
# not shaped: control traffic only); 10.78.0.11.. the PS shards; 10.78.0.21..
# the workers. Workers use --compute=synthetic: each step sleeps
# --compute_ms (a GPU's forward and backward) and exchanges --model_bytes of
# gradients (default: ResNet-50's 25557032 fp32 parameters), so the links,
# not this machine's cores, should decide the step time.
#
# Before the runs, a plain TCP transfer (iperf3, 3 s) from a worker host to
# a PS host checks the shaping: it must reach 85-100% of --link_mbit.
# Every host shares this machine's CPU cores, which bounds how fast the
# emulation can go: the report says how many cores there were.
#
# Shaping: tbf (token bucket) on each host's egress and on the switch's
# egress towards each host. --link_delay_ms > 0 adds netem delay, which
# needs the sch_netem kernel module; without it the script stops with an
# error before anything runs.
#
# Needs root (network namespaces, tc), iproute2 and iperf3.
set -euo pipefail

LINK_MBIT=1000
LINK_DELAY_MS=0
QUEUE_MS=${QUEUE_MS:-10}
WORKERS=4
NUM_PS=2,4
MODES=ps_sync,allreduce
COMPUTE_MS=100
MODEL_BYTES=102228128
STEPS=10
BATCH_SIZE=32
PARTITION_BYTES=4194304
OUT_DIR=""
BIN=bazel-bin
for arg in "$@"; do
  case "$arg" in
    --link_mbit=*) LINK_MBIT="${arg#*=}" ;;
    --link_delay_ms=*) LINK_DELAY_MS="${arg#*=}" ;;
    --workers=*) WORKERS="${arg#*=}" ;;
    --num_ps=*) NUM_PS="${arg#*=}" ;;
    --modes=*) MODES="${arg#*=}" ;;
    --compute_ms=*) COMPUTE_MS="${arg#*=}" ;;
    --model_bytes=*) MODEL_BYTES="${arg#*=}" ;;
    --steps=*) STEPS="${arg#*=}" ;;
    --batch_size=*) BATCH_SIZE="${arg#*=}" ;;
    --partition_bytes=*) PARTITION_BYTES="${arg#*=}" ;;
    --out_dir=*) OUT_DIR="${arg#*=}" ;;
    --bin=*) BIN="${arg#*=}" ;;
    *)
      echo "emulated_links.sh: error: unknown argument \"$arg\" (see the" \
        "header of scripts/emulated_links.sh)" >&2
      exit 2
      ;;
  esac
done
fail() {
  echo "emulated_links.sh: error: $*" >&2
  exit 2
}
[[ "$LINK_MBIT" =~ ^[0-9]+$ && "$LINK_MBIT" -ge 1 ]] ||
  fail "--link_mbit=$LINK_MBIT: expected a positive integer (Mbit/s)"
[[ "$LINK_DELAY_MS" =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
  fail "--link_delay_ms=$LINK_DELAY_MS: expected a number >= 0 (ms)"
[[ -n "$OUT_DIR" ]] || OUT_DIR="docs/results/emulated_${LINK_MBIT}mbit"
BIN="$(cd "$BIN" && pwd)" || fail "--bin: no such directory"
PSTRAIN="$BIN/tools/pstrain"
for b in "$PSTRAIN" "$BIN/server/pstrain_ps" "$BIN/worker/pstrain_worker"; do
  [[ -x "$b" ]] || fail "$b is not built (bazel build //...)"
done
command -v iperf3 >/dev/null || fail "iperf3 not found (apt-get install iperf3)"
[[ "$(id -u)" == 0 ]] || fail "needs root to create network namespaces and tc"

# The most hosts any configuration needs.
max_of() { tr ',' '\n' <<<"$1" | sort -n | tail -1; }
MAX_W="$(max_of "$WORKERS")"
MAX_PS="$(max_of "$NUM_PS")"
((MAX_W <= 60 && MAX_PS <= 60)) || fail "at most 60 workers and 60 PS hosts"

TAG="el$$"
SWITCH="${TAG}sw"
HOSTS=(c)
for ((i = 0; i < MAX_PS; i++)); do HOSTS+=("p$i"); done
for ((i = 0; i < MAX_W; i++)); do HOSTS+=("w$i"); done
ip_of() {
  case "$1" in
    c) echo 10.78.0.1 ;;
    p*) echo "10.78.0.$((11 + ${1#p}))" ;;
    w*) echo "10.78.0.$((71 + ${1#w}))" ;;
  esac
}
ns_of() { echo "${TAG}$1"; }
IPERF_PID=""
cleanup() {
  [[ -n "$IPERF_PID" ]] && kill "$IPERF_PID" 2>/dev/null
  for h in "${HOSTS[@]}"; do
    ns="$(ns_of "$h")"
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid"; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns del "$SWITCH" 2>/dev/null || true
}
trap cleanup EXIT

# tc shaping of one interface: RATE Mbit/s, optional netem delay.
shape() {  # shape NETNS DEV
  local burst=$((LINK_MBIT * 1000000 / 8 / 250))  # 4 ms of traffic
  ((burst < 32000)) && burst=32000
  if [[ "$LINK_DELAY_MS" != 0 ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem \
      delay "${LINK_DELAY_MS}ms" limit 100000 ||
      fail "--link_delay_ms needs the sch_netem kernel module, which" \
        "this kernel ($(uname -r)) lacks"
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: tbf \
      rate "${LINK_MBIT}mbit" burst "$burst" latency "${QUEUE_MS}ms"
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf \
      rate "${LINK_MBIT}mbit" burst "$burst" latency "${QUEUE_MS}ms"
  fi
}

ip netns add "$SWITCH"
ip -n "$SWITCH" link add br0 type bridge
ip -n "$SWITCH" link set br0 up
for h in "${HOSTS[@]}"; do
  ns="$(ns_of "$h")"
  ip netns add "$ns"
  ip link add "${TAG}a$h" type veth peer name "${TAG}b$h"
  ip link set "${TAG}a$h" netns "$ns"
  ip link set "${TAG}b$h" netns "$SWITCH"
  ip -n "$ns" link set "${TAG}a$h" name eth0
  ip -n "$ns" addr add "$(ip_of "$h")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$SWITCH" link set "${TAG}b$h" master br0
  ip -n "$SWITCH" link set "${TAG}b$h" up
  if [[ "$h" != c ]]; then
    shape "$ns" eth0
    shape "$SWITCH" "${TAG}b$h"
  fi
done
echo "network: ${#HOSTS[@]} hosts on a switch, links ${LINK_MBIT} Mbit/s" \
  "each way, ${LINK_DELAY_MS} ms delay; $(nproc) CPU cores shared by all"

# --- The shaped rate, by a plain TCP transfer ----------------------------
ip netns exec "$(ns_of p0)" iperf3 -s -1 -B "$(ip_of p0)" >/dev/null 2>&1 &
IPERF_PID=$!
sleep 0.5
TCP_MBIT="$(ip netns exec "$(ns_of w0)" iperf3 -c "$(ip_of p0)" -t 3 -J |
  python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))')"
wait "$IPERF_PID" 2>/dev/null || true
IPERF_PID=""
echo "TCP check (iperf3, w0 -> p0, 3 s): $TCP_MBIT Mbit/s of $LINK_MBIT"
python3 - "$TCP_MBIT" "$LINK_MBIT" <<'EOF' || fail "the shaped links carry $TCP_MBIT Mbit/s of TCP, not 85-100% of --link_mbit=$LINK_MBIT; the emulation is not what it claims"
import sys
measured, nominal = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if 0.85 * nominal <= measured <= 1.0 * nominal else 1)
EOF

# --- The comparison --------------------------------------------------------
ps_netns=""
for ((i = 0; i < MAX_PS; i++)); do
  ps_netns+="${ps_netns:+,}$(ns_of "p$i"):$(ip_of "p$i")"
done
worker_netns=""
for ((i = 0; i < MAX_W; i++)); do
  worker_netns+="${worker_netns:+,}$(ns_of "w$i"):$(ip_of "w$i")"
done
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
ip netns exec "$(ns_of c)" "$PSTRAIN" compare --compute=synthetic \
  --compute_ms="$COMPUTE_MS" --model_bytes="$MODEL_BYTES" \
  --batch_size="$BATCH_SIZE" --partition_bytes="$PARTITION_BYTES" \
  --workers="$WORKERS" --num_ps="$NUM_PS" \
  --modes="$MODES" --steps="$STEPS" --log_every_steps=1000000 \
  --link_mbit="$LINK_MBIT" --coordinator_host="$(ip_of c)" \
  --ps_netns="$ps_netns" --worker_netns="$worker_netns" \
  --heartbeat_timeout_s=120 --out_dir="$OUT_DIR"
{
  echo
  echo "Emulated links: \`bash scripts/emulated_links.sh $*\`:" \
    "${LINK_MBIT} Mbit/s each way per host (tc tbf), ${LINK_DELAY_MS} ms" \
    "delay; iperf3 TCP check $TCP_MBIT Mbit/s; $(nproc) CPU cores shared" \
    "by every host."
} >>"$OUT_DIR/results.md"
echo "TCP check: $TCP_MBIT Mbit/s; results in $OUT_DIR"
