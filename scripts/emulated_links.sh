#!/bin/bash
# `pstrain compare` over emulated network links: every PS and worker on its
# own host (a network namespace), each host on its own link to a switch (a
# bridge in another namespace), each link shaped by tc in both directions.
#
#   bash scripts/emulated_links.sh [--link_mbit=1000] [--link_delay_ms=0]
#        [--workers=4] [--num_ps=2,4] [--modes=ps_sync,allreduce]
#        [--compute_ms=100] [--backward_fraction=0]
#        [--model_bytes=102228128] [--steps=10]
#        [--batch_size=32] [--partition_bytes=BYTES]
#        [--bucket_bytes=26214400] [--out_dir=DIR]
#        [--wire_dtype=fp32] [--compression=none] [--optimizer=adam]
#        [--delta_pulls=true] [--priority_pulls=false]
#        [--momentum=0] [--nesterov=false] [--momentum_correction=false]
#        [--compression_warmup_steps=0] [--compression_warmup_start=0]
#        (the last three: top-k rows only)
#        [--queue_ms=10] [--tcp_cc=NAME] [--mtu=1500] [--bin=bazel-bin]
#        [--link_profile=false] [--tcp_notsent_lowat=0]
#        [--channels_per_shard=0] (PS rows; 0: pstrain's automatic count)
#        [--model=NAME] (the synthetic step shaped like NAME: its tensors,
#        each layer's time by its multiply-accumulates; --model_bytes must
#        then be the model's bytes, which the raw TCP baseline moves)
#
# Hosts: 10.78.0.1 runs `pstrain compare` and its coordinator (its link is
# not shaped: control traffic only); 10.78.0.11.. the PS shards; 10.78.0.71..
# the workers. Workers use --compute=synthetic: each step sleeps
# --compute_ms (a GPU's forward and backward) and exchanges --model_bytes of
# gradients (default: ResNet-50's 25557032 fp32 parameters), so the links,
# not this machine's cores, should decide the step time. With
# --priority_pulls=true (PS rows) the shards send the front tensors first
# and each step's synthetic forward (the first 1 - --backward_fraction of
# --compute_ms) runs tensor by tensor, each share once its weights are in,
# as a model's layers do (worker/workload.cc SyntheticWorkload).
#
# Before the runs, a plain TCP transfer (iperf3, 3 s) from a worker host to
# a PS host checks the shaping: it must reach 85-100% of --link_mbit.
# Every host shares this machine's CPU cores, which bounds how fast the
# emulation can go: the report says how many cores there were.
#
# Shaping: tbf (token bucket) on each host's egress and on the switch's
# egress towards each host, each queue at most --queue_ms of traffic (tbf's
# latency; packets beyond it are dropped, as by a switch's shallow buffer).
# --link_delay_ms > 0 adds netem delay, which needs the sch_netem kernel
# module; without it the script stops with an error before anything runs.
#
# --mtu sets every link's MTU in bytes (veth and bridge; 68-65535). The
# default, 1500, is Ethernet's; 9000 is the jumbo frame that GPU clusters'
# data-centre networks usually run. tbf counts every frame's headers
# against the rate, so the MTU decides how much of --link_mbit TCP can
# carry as payload (about 95.7% at 1500, 99.3% at 9000); the iperf3 check
# and the report show it.
#
# TCP congestion control: every host uses the kernel's default
# (/proc/sys/net/ipv4/tcp_congestion_control) unless --tcp_cc names one of
# tcp_available_congestion_control. The choice matters for the PS: a sync
# shard's chunk is ready only when the slowest of its n incoming flows
# delivers it, so flow-rate unfairness shows up as step time (BENCHMARKS.md
# compares bbr and cubic). A namespace may only pick a congestion control
# in tcp_allowed_congestion_control, so --tcp_cc adds it there for the run
# and puts the list back on exit. The report names the one used.
#
# --link_profile=true (one ps_sync row only: --modes=ps_sync and one
# --num_ps) samples every link's byte counters every 5 ms during the run
# (scripts/link_profile.py, in the switch's namespace; OUT_DIR/
# link_samples.csv) and adds to the report where the step's time goes:
# the shards' ingress, the pull tail after the last push, and the links'
# idle gap before the next step's pushes (the forward no transfer overlaps).
#
# --tcp_notsent_lowat=BYTES (> 0) sets every host's
# net.ipv4.tcp_notsent_lowat: a socket takes no more data while that many
# bytes wait unsent in it, so a sender's backlog stays in the application,
# where a priority order can still reorder it, instead of in the kernel's
# send buffer (megabytes a connection otherwise). 0 keeps the kernel's
# default (no limit).
#
# Needs root (network namespaces, tc), iproute2 and iperf3.
set -euo pipefail
# shellcheck source=scripts/netns_hosts.sh
source "$(dirname "$0")/netns_hosts.sh"

LINK_MBIT=1000
LINK_DELAY_MS=0
QUEUE_MS=10
TCP_CC=""
MTU=1500
WORKERS=4
NUM_PS=2,4
MODES=ps_sync,allreduce
# The PS rows' wire format and compression list (pstrain compare's flags:
# --compression=none,topk:0.01 gives a PS row of each).
WIRE_DTYPE=fp32
COMPRESSION=none
# The job's optimizer for every row (pstrain's --optimizer): sgd makes a
# top-k push's update sparse, which delta pulls carry (--delta_pulls).
OPTIMIZER=adam
# SGD's momentum for every row; Deep Gradient Compression's momentum
# correction and sparsity warm-up for the top-k rows (pstrain's flags of
# the same names): a top-k run as DGC trains, warm-up steps included.
MOMENTUM=0
NESTEROV=false
MOMENTUM_CORRECTION=false
COMPRESSION_WARMUP_STEPS=0
COMPRESSION_WARMUP_START=0
DELTA_PULLS=true
PRIORITY_PULLS=false
LINK_PROFILE=false
TCP_NOTSENT_LOWAT=0
CHANNELS_PER_SHARD=0
MODEL=""
COMPUTE_MS=100
BACKWARD_FRACTION=0
MODEL_BYTES=102228128
STEPS=10
BATCH_SIZE=32
PARTITION_BYTES=""  # pstrain's default: 4 MiB, 256 KiB with priority pulls
BUCKET_BYTES=26214400
OUT_DIR=""
BIN=bazel-bin
for arg in "$@"; do
  case "$arg" in
    --link_mbit=*) LINK_MBIT="${arg#*=}" ;;
    --link_delay_ms=*) LINK_DELAY_MS="${arg#*=}" ;;
    --queue_ms=*) QUEUE_MS="${arg#*=}" ;;
    --tcp_cc=*) TCP_CC="${arg#*=}" ;;
    --mtu=*) MTU="${arg#*=}" ;;
    --workers=*) WORKERS="${arg#*=}" ;;
    --num_ps=*) NUM_PS="${arg#*=}" ;;
    --modes=*) MODES="${arg#*=}" ;;
    --compute_ms=*) COMPUTE_MS="${arg#*=}" ;;
    --backward_fraction=*) BACKWARD_FRACTION="${arg#*=}" ;;
    --model_bytes=*) MODEL_BYTES="${arg#*=}" ;;
    --steps=*) STEPS="${arg#*=}" ;;
    --batch_size=*) BATCH_SIZE="${arg#*=}" ;;
    --partition_bytes=*) PARTITION_BYTES="${arg#*=}" ;;
    --bucket_bytes=*) BUCKET_BYTES="${arg#*=}" ;;
    --wire_dtype=*) WIRE_DTYPE="${arg#*=}" ;;
    --compression=*) COMPRESSION="${arg#*=}" ;;
    --optimizer=*) OPTIMIZER="${arg#*=}" ;;
    --delta_pulls=*) DELTA_PULLS="${arg#*=}" ;;
    --momentum=*) MOMENTUM="${arg#*=}" ;;
    --nesterov=*) NESTEROV="${arg#*=}" ;;
    --momentum_correction=*) MOMENTUM_CORRECTION="${arg#*=}" ;;
    --compression_warmup_steps=*) COMPRESSION_WARMUP_STEPS="${arg#*=}" ;;
    --compression_warmup_start=*) COMPRESSION_WARMUP_START="${arg#*=}" ;;
    --priority_pulls=*) PRIORITY_PULLS="${arg#*=}" ;;
    --link_profile=*) LINK_PROFILE="${arg#*=}" ;;
    --tcp_notsent_lowat=*) TCP_NOTSENT_LOWAT="${arg#*=}" ;;
    --channels_per_shard=*) CHANNELS_PER_SHARD="${arg#*=}" ;;
    --model=*) MODEL="${arg#*=}" ;;
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
[[ "$QUEUE_MS" =~ ^[0-9]+$ && "$QUEUE_MS" -ge 1 ]] ||
  fail "--queue_ms=$QUEUE_MS: expected a positive integer (ms)"
[[ "$MOMENTUM" =~ ^(0|0?\.[0-9]+)$ ]] ||
  fail "--momentum=$MOMENTUM: expected a number in [0, 1)"
for flag in NESTEROV MOMENTUM_CORRECTION; do
  [[ "${!flag}" =~ ^(true|false)$ ]] ||
    fail "--${flag,,}=${!flag}: expected true or false"
done
[[ "$COMPRESSION_WARMUP_STEPS" =~ ^[0-9]+$ ]] ||
  fail "--compression_warmup_steps=$COMPRESSION_WARMUP_STEPS: expected a" \
    "step count >= 0"
[[ "$COMPRESSION_WARMUP_START" =~ ^(0|1|0?\.[0-9]+)$ ]] ||
  fail "--compression_warmup_start=$COMPRESSION_WARMUP_START: expected a" \
    "fraction in [0, 1] (0: pstrain's default)"
[[ "$MTU" =~ ^[0-9]+$ && "$MTU" -ge 68 && "$MTU" -le 65535 ]] ||
  fail "--mtu=$MTU: expected an integer from 68 to 65535 (bytes)"
[[ "$PRIORITY_PULLS" == true || "$PRIORITY_PULLS" == false ]] ||
  fail "--priority_pulls=$PRIORITY_PULLS: expected true or false"
[[ "$CHANNELS_PER_SHARD" =~ ^[0-9]+$ ]] ||
  fail "--channels_per_shard=$CHANNELS_PER_SHARD: expected a count >= 0" \
    "(0: automatic)"
[[ "$TCP_NOTSENT_LOWAT" =~ ^[0-9]+$ ]] ||
  fail "--tcp_notsent_lowat=$TCP_NOTSENT_LOWAT: expected bytes >= 0"
[[ "$LINK_PROFILE" == true || "$LINK_PROFILE" == false ]] ||
  fail "--link_profile=$LINK_PROFILE: expected true or false"
if [[ "$LINK_PROFILE" == true ]]; then
  [[ "$MODES" == ps_sync && "$NUM_PS" =~ ^[0-9]+$ ]] ||
    fail "--link_profile=true profiles one sync PS run's steps: expected" \
      "--modes=ps_sync and one --num_ps (got --modes=$MODES" \
      "--num_ps=$NUM_PS)"
fi
CC_SYSCTL=/proc/sys/net/ipv4
# cc_listed LIST NAME: whether NAME is in the space-separated sysctl LIST.
cc_listed() { tr ' ' '\n' <"$CC_SYSCTL/$1" | grep -qx "$2"; }
if [[ -z "$TCP_CC" ]]; then
  TCP_CC="$(cat "$CC_SYSCTL/tcp_congestion_control")"
elif ! cc_listed tcp_available_congestion_control "$TCP_CC"; then
  fail "--tcp_cc=$TCP_CC: not one of this kernel's congestion controls" \
    "($(cat "$CC_SYSCTL/tcp_available_congestion_control"))"
fi
[[ -n "$OUT_DIR" ]] || OUT_DIR="docs/results/emulated_${LINK_MBIT}mbit"
BIN="$(cd "$BIN" && pwd)" || fail "--bin: no such directory"
PSTRAIN="$BIN/cli/pstrain"
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
ALLOWED_CC=""  # the allowed list to put back on exit, when changed
cleanup() {
  [[ -n "$IPERF_PID" ]] && kill "$IPERF_PID" 2>/dev/null
  for h in "${HOSTS[@]}"; do netns_remove "$(ns_of "$h")"; done
  netns_remove "$SWITCH"
  [[ -n "$ALLOWED_CC" ]] &&
    echo "$ALLOWED_CC" >"$CC_SYSCTL/tcp_allowed_congestion_control"
  return 0
}
trap cleanup EXIT
if ! cc_listed tcp_allowed_congestion_control "$TCP_CC"; then
  ALLOWED_CC="$(cat "$CC_SYSCTL/tcp_allowed_congestion_control")"
  echo "$ALLOWED_CC $TCP_CC" >"$CC_SYSCTL/tcp_allowed_congestion_control" ||
    fail "cannot allow --tcp_cc=$TCP_CC in network namespaces"
fi

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

netns_switch "$SWITCH"
for h in "${HOSTS[@]}"; do
  ns="$(ns_of "$h")"
  netns_host "$SWITCH" "$ns" "$(ip_of "$h")/24" "${TAG}$h"
  ip -n "$ns" link set eth0 mtu "$MTU" &&
    ip -n "$SWITCH" link set "${TAG}$h" mtu "$MTU" ||
    fail "cannot set --mtu=$MTU on host $h's link"
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$TCP_CC" ||
    fail "cannot set TCP congestion control $TCP_CC in $ns"
  if ((TCP_NOTSENT_LOWAT > 0)); then
    ip netns exec "$ns" sysctl -qw \
      net.ipv4.tcp_notsent_lowat="$TCP_NOTSENT_LOWAT" ||
      fail "cannot set net.ipv4.tcp_notsent_lowat in $ns"
  fi
  if [[ "$h" != c ]]; then
    shape "$ns" eth0
    shape "$SWITCH" "${TAG}$h"
  fi
done
echo "network: ${#HOSTS[@]} hosts on a switch, links ${LINK_MBIT} Mbit/s" \
  "each way, MTU $MTU, ${LINK_DELAY_MS} ms delay, ${QUEUE_MS} ms queues, TCP" \
  "$TCP_CC; $(nproc) CPU cores shared by all"

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

# --- Raw TCP baseline: each scheme's bytes over plain sockets -------------
# scripts/tcp_exchange.py moves one step's bytes in each scheme's pattern
# with no gRPC, no aggregation and no step-to-step dependency: the time the
# links and TCP allow, beside the bandwidth bound (median of 3 tries).
TCPX="$(cd "$(dirname "$0")" && pwd)/tcp_exchange.py"
RAW_DIR="$(mktemp -d)"
# run_pattern: runs the servers and clients set up in SERVE/CONNECT
# (arrays of "NETNS ARGS..."), prints the slowest client's seconds.
run_pattern() {
  local pids=() i=0 line
  for line in "${SERVE[@]}"; do
    # shellcheck disable=SC2086
    ip netns exec $line &
    pids+=($!)
  done
  for line in "${CONNECT[@]}"; do
    # shellcheck disable=SC2086
    ip netns exec $line >"$RAW_DIR/c$i" &
    pids+=($!)
    i=$((i + 1))
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || fail "raw TCP baseline: a transfer failed (see above)"
  done
  cat "$RAW_DIR"/c* | sort -g | tail -1
  rm -f "$RAW_DIR"/c*
}
median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
ps_pattern() {  # ps_pattern N K
  local n=$1 k=$2 share=$((MODEL_BYTES / $2)) servers="" s w
  SERVE=() CONNECT=()
  for ((s = 0; s < k; s++)); do
    SERVE+=("$(ns_of "p$s") python3 $TCPX serve --bind $(ip_of "p$s") --port 7999 --peers $n --recv_bytes $share --send_bytes $share")
    servers+="${servers:+,}$(ip_of "p$s"):7999"
  done
  for ((w = 0; w < n; w++)); do
    CONNECT+=("$(ns_of "w$w") python3 $TCPX connect --servers $servers --send_bytes $share --recv_bytes $share")
  done
  run_pattern
}
ring_pattern() {  # ring_pattern N
  local n=$1 bytes=$((2 * (${1} - 1) * MODEL_BYTES / ${1})) w
  SERVE=() CONNECT=()
  for ((w = 0; w < n; w++)); do
    SERVE+=("$(ns_of "w$w") python3 $TCPX serve --bind $(ip_of "w$w") --port 7998 --peers 1 --recv_bytes $bytes --send_bytes 0")
    CONNECT+=("$(ns_of "w$w") python3 $TCPX connect --servers $(ip_of "w$(((w + 1) % n))"):7998 --send_bytes $bytes --recv_bytes 0")
  done
  run_pattern
}
RAW_TABLE="| #Workers | Pattern | #PS | Bytes per worker each way | Raw TCP/step | Bound/step | Raw TCP/bound |
|---:|---|---:|---:|---:|---:|---:|"
for n in ${WORKERS//,/ }; do
  runs=()
  if [[ ",$MODES," == *,ps_* ]]; then
    for k in ${NUM_PS//,/ }; do
      runs+=("ps $k")
    done
  fi
  [[ ",$MODES," == *,allreduce,* && "$n" -gt 1 ]] && runs+=("ring 0")
  for run in "${runs[@]}"; do
    read -r pattern k <<<"$run"
    if [[ "$pattern" == ps ]]; then
      t=() ; for _ in 1 2 3; do t+=("$(ps_pattern "$n" "$k")"); done
      # BytePS bound: a worker's link carries M each way, a shard's n*M/k.
      bytes=$MODEL_BYTES
      bound_bytes=$((n > k ? n * MODEL_BYTES / k : MODEL_BYTES))
    else
      t=() ; for _ in 1 2 3; do t+=("$(ring_pattern "$n")"); done
      bytes=$((2 * (n - 1) * MODEL_BYTES / n))
      bound_bytes=$bytes
    fi
    RAW_TABLE+="
$(python3 -c 'import sys
n, pat, k, by, t, bb, mbit = sys.argv[1:]
bound = int(bb) * 8 / (float(mbit) * 1e6)
print("| %s | %s | %s | %s | %.1f ms | %.1f ms | %.2fx |" % (n, pat, k if pat == "ps" else 0, by, float(t) * 1e3, bound * 1e3, float(t) / bound))' \
      "$n" "$pattern" "$k" "$bytes" "$(median3 "${t[@]}")" "$bound_bytes" "$LINK_MBIT")"
  done
done
rmdir "$RAW_DIR"
echo "raw TCP baseline (scripts/tcp_exchange.py, median of 3):"
echo "$RAW_TABLE"

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
# Only when asked: an allreduce-only comparison refuses the PS flags.
# --wire_dtype applies to every mode (allreduce averages in the 16-bit
# type too).
ps_wire=()
# Only allreduce has buckets: a PS-only comparison refuses the flag.
[[ ",$MODES," == *,allreduce,* ]] && ps_wire+=(--bucket_bytes="$BUCKET_BYTES")
[ "$WIRE_DTYPE" = fp32 ] || ps_wire+=(--wire_dtype="$WIRE_DTYPE")
# --num_ps and --delta_pulls only with a PS mode (an allreduce-only
# comparison refuses them); --compression is every mode's.
any_ps=false
[[ ",$MODES," == *,ps_* ]] && any_ps=true
[ "$any_ps" = false ] || ps_wire+=(--num_ps="$NUM_PS")
[ "$COMPRESSION" = none ] || ps_wire+=(--compression="$COMPRESSION")
[ "$COMPRESSION" = none ] || [ "$any_ps" = false ] ||
  ps_wire+=(--delta_pulls="$DELTA_PULLS")
[ "$PRIORITY_PULLS" = false ] || ps_wire+=(--priority_pulls=true)
[ "$CHANNELS_PER_SHARD" = 0 ] ||
  ps_wire+=(--channels_per_shard="$CHANNELS_PER_SHARD")
[ "$MOMENTUM_CORRECTION" = false ] || ps_wire+=(--momentum_correction=true)
[ "$COMPRESSION_WARMUP_STEPS" = 0 ] ||
  ps_wire+=(--compression_warmup_steps="$COMPRESSION_WARMUP_STEPS")
[ "$COMPRESSION_WARMUP_START" = 0 ] ||
  ps_wire+=(--compression_warmup_start="$COMPRESSION_WARMUP_START")
[ "$MOMENTUM" = 0 ] || ps_wire+=(--momentum="$MOMENTUM")
[ "$NESTEROV" = false ] || ps_wire+=(--nesterov=true)
PROFILER_PID=""
if [[ "$LINK_PROFILE" == true ]]; then
  PROFILER="$(cd "$(dirname "$0")" && pwd)/link_profile.py"
  ip netns exec "$SWITCH" python3 "$PROFILER" sample \
    "$OUT_DIR/link_samples.csv" --strip_prefix="$TAG" &
  PROFILER_PID=$!
fi
# The synthetic step's shape: --model's tensors, or --model_bytes of them.
shape=(--model_bytes="$MODEL_BYTES")
[[ -z "$MODEL" ]] || shape=(--model="$MODEL")
[[ -z "$PARTITION_BYTES" ]] || shape+=(--partition_bytes="$PARTITION_BYTES")
ip netns exec "$(ns_of c)" "$PSTRAIN" compare --compute=synthetic \
  --compute_ms="$COMPUTE_MS" --backward_fraction="$BACKWARD_FRACTION" \
  "${shape[@]}" \
  --batch_size="$BATCH_SIZE" \
  --workers="$WORKERS" \
  --modes="$MODES" --steps="$STEPS" --log_every_steps=1000000 \
  "${ps_wire[@]}" --optimizer="$OPTIMIZER" \
  --link_mbit="$LINK_MBIT" --coordinator_host="$(ip_of c)" \
  --ps_netns="$ps_netns" --worker_netns="$worker_netns" \
  --heartbeat_timeout_s=120 --out_dir="$OUT_DIR"
if [[ -n "$PROFILER_PID" ]]; then
  kill -TERM "$PROFILER_PID" 2>/dev/null || true
  wait "$PROFILER_PID" || true
  ps_ports=""
  for ((i = 0; i < NUM_PS; i++)); do ps_ports+="${ps_ports:+,}p$i"; done
  {
    echo
    python3 "$PROFILER" report "$OUT_DIR/link_samples.csv" \
      --ps="$ps_ports" || echo "(no link profile: see the error above)"
  } >>"$OUT_DIR/results.md"
fi
{
  echo
  echo "Emulated links: \`bash scripts/emulated_links.sh $*\`:" \
    "${LINK_MBIT} Mbit/s each way per host (tc tbf, ${QUEUE_MS} ms queues)," \
    "MTU $MTU bytes," \
    "${LINK_DELAY_MS} ms delay, TCP congestion control $TCP_CC; iperf3" \
    "TCP check $TCP_MBIT Mbit/s; $(nproc) CPU cores shared by every host."
  echo
  echo "Raw TCP baseline: the same bytes in each scheme's pattern over plain"
  echo "sockets (scripts/tcp_exchange.py; no gRPC, no aggregation), median of"
  echo "3 tries, on the same links:"
  echo
  echo "$RAW_TABLE"
} >>"$OUT_DIR/results.md"
# Committed results carry no machine paths.
sed -i "s|$(pwd)/||g" "$OUT_DIR/results.md" "$OUT_DIR/results.json"
echo "TCP check: $TCP_MBIT Mbit/s; results in $OUT_DIR"
