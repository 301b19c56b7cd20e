#!/bin/bash
# A pstrain cluster of five hosts on one machine: each host is a network
# namespace with its own address (10.77.0.1-5/24), joined by veth pairs to a
# bridge in a sixth namespace. Host 1 runs the coordinator, hosts 2-3 a PS
# each, hosts 4-5 a worker each.
#
#   1. `pstrain submit` a LeNet-5 Fashion-MNIST job (1 epoch), start its
#      tasks on their hosts, `pstrain wait`: the job SUCCEEDS, the test
#      accuracy is >= 0.75, and every process has exited.
#   2. The same with 20 epochs; SIGKILL worker 1 once it trains: the job
#      ends FAILED within the heartbeat timeout, naming worker 1 and its
#      host, and no process of the job is left.
#   3. The 1-epoch job again through one `pstrain node` agent per host
#      (hosts 2-5), which find their tasks by their addresses: it SUCCEEDS
#      and every agent exits.
#
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create namespaces; prints
# SKIP and exits 0 where it may not. Run by hand:
#   bash tests/netns_cluster_test.sh [BIN_DIR]   (default: bazel-bin)
# or through Bazel: bazel test //tests:netns_cluster_test
set -u

if [[ -n "${TEST_SRCDIR:-}" ]]; then
  BIN="$(pwd)"
  # shellcheck source=scripts/netns_hosts.sh
  source "$BIN/scripts/netns_hosts.sh"
else
  BIN="$(cd "${1:-bazel-bin}" && pwd)"
  # shellcheck source=scripts/netns_hosts.sh
  source "$(dirname "$0")/../scripts/netns_hosts.sh"
fi
PSTRAIN="$BIN/cli/pstrain"
PS="$BIN/server/pstrain_ps"
WORKER="$BIN/worker/pstrain_worker"
COORDINATOR="$BIN/coordinator/pstrain_coordinator"
DATA=/usr/share/datasets/fashion-mnist
HEARTBEAT_TIMEOUT_S=5

for b in "$PSTRAIN" "$PS" "$WORKER" "$COORDINATOR"; do
  [[ -x "$b" ]] || { echo "FAIL: $b is not built"; exit 1; }
done
if [[ ! -f "$DATA/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: dataset-fashion-mnist is not installed"
  exit 0
fi

TAG="p$$"
SWITCH="${TAG}sw"
TMP="$(mktemp -d /tmp/pstrain-netns-XXXXXX)"
# Every process of this cluster speaks mutual TLS (common/tls.h): the
# coordinator, the CLI and the tasks find their files through the
# environment.
"$PSTRAIN" certs --out="$TMP/tls" --num_ps=4 --num_workers=4 >/dev/null ||
  { echo "FAIL: pstrain certs"; exit 1; }
export PSTRAIN_TLS_DIR="$TMP/tls"
host_ns() { echo "${TAG}h$1"; }
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  netns_remove "$(host_ns 1)" "$(host_ns 2)" "$(host_ns 3)" "$(host_ns 4)" \
    "$(host_ns 5)" "$SWITCH"
  rm -rf "$TMP"
}
trap cleanup EXIT

if ! err="$(netns_switch "$SWITCH" 2>&1)"; then
  echo "SKIP: cannot create network namespaces here (needs root): $err"
  trap - EXIT
  netns_remove "$SWITCH"
  rm -rf "$TMP"
  exit 0
fi

# --- The network ---------------------------------------------------------
set -e
for i in 1 2 3 4 5; do
  netns_host "$SWITCH" "$(host_ns "$i")" "10.77.0.$i/24" "${TAG}s$i"
done
set +e
echo "network: 5 hosts 10.77.0.1-5 on a bridge"

on() {  # on HOST COMMAND...: runs COMMAND on host HOST
  local host="$1"
  shift
  ip netns exec "$(host_ns "$host")" "$@"
}

ip netns exec "$(host_ns 1)" "$COORDINATOR" --bind=10.77.0.1 --port=7070 \
  --heartbeat_timeout_s=$HEARTBEAT_TIMEOUT_S --job_file="$TMP/jobs.pb" \
  >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
disown
COORD=10.77.0.1:7070
for _ in $(seq 50); do
  on 1 "$PSTRAIN" status --coordinator=$COORD >/dev/null 2>&1 && break
  sleep 0.1
done

write_spec() {  # write_spec FILE EPOCHS
  cat >"$1" <<EOF
model: "lenet5"
dataset: "fashion_mnist"
mode: "sync"
num_ps: 2
num_workers: 2
batch_size: 64
epochs: $2
log_every_steps: 100
ps_hosts { host: "10.77.0.2" port: 7000 }
ps_hosts { host: "10.77.0.3" port: 7000 }
worker_hosts { host: "10.77.0.4" }
worker_hosts { host: "10.77.0.5" }
EOF
}

# start_tasks JOB: starts ps 0-1 on hosts 2-3 and workers 0-1 on hosts 4-5;
# their pids go to TASK_PIDS (ps0 ps1 worker0 worker1).
start_tasks() {
  TASK_PIDS=()
  for t in 0 1; do
    # A simple command in the background, so that $! is the task itself.
    ip netns exec "$(host_ns $((t + 2)))" "$PS" --coordinator=$COORD \
      --job="$1" --task_index=$t >"$TMP/$1-ps$t.log" 2>&1 &
    TASK_PIDS+=($!)
    PIDS+=($!)
    disown
  done
  for t in 0 1; do
    OMP_NUM_THREADS=1 ip netns exec "$(host_ns $((t + 4)))" "$WORKER" \
      --coordinator=$COORD --job="$1" --task_index=$t \
      >"$TMP/$1-worker$t.log" 2>&1 &
    TASK_PIDS+=($!)
    PIDS+=($!)
    disown
  done
}

# wait_exit PID SECONDS: 0 once PID has exited, 1 if still running.
wait_exit() {
  for _ in $(seq $(($2 * 10))); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

FAILURES=0
fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}

# --- 1. A whole job -------------------------------------------------------
write_spec "$TMP/one_epoch.pbtxt" 1
JOB="$(on 1 "$PSTRAIN" submit "$TMP/one_epoch.pbtxt" --coordinator=$COORD)"
echo "submitted $JOB (1 epoch, 2 ps on 10.77.0.2-3, 2 workers on 10.77.0.4-5)"
start_tasks "$JOB"
on 1 "$PSTRAIN" wait "$JOB" --coordinator=$COORD >"$TMP/wait1.txt" 2>&1
code=$?
cat "$TMP/wait1.txt"
[[ $code -eq 0 ]] || fail "pstrain wait $JOB exited $code"
accuracy="$(tail -1 "$TMP/wait1.txt" | awk -F'|' '{gsub(/ /, "", $11); print $11}')"
if ! awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.75) }'; then
  fail "test accuracy '$accuracy' < 0.75"
fi
grep -q "advertised as 10.77.0.3:7000" "$TMP/wait1.txt" ||
  fail "ps 1 did not serve on 10.77.0.3:7000"
for pid in "${TASK_PIDS[@]}"; do
  wait_exit "$pid" 15 || fail "task pid $pid still running after the job"
done
echo "job 1: SUCCEEDED, test accuracy $accuracy, every task exited"

# --- 2. A worker killed mid-training --------------------------------------
write_spec "$TMP/long.pbtxt" 20
JOB="$(on 1 "$PSTRAIN" submit "$TMP/long.pbtxt" --coordinator=$COORD)"
echo "submitted $JOB (20 epochs); SIGKILL worker 1 once it trains"
start_tasks "$JOB"
training=0
for _ in $(seq 300); do
  if on 1 "$PSTRAIN" status "$JOB" --coordinator=$COORD 2>/dev/null |
    grep -Eq "worker 1 +REGISTERED .* [1-9][0-9]* steps"; then
    training=1
    break
  fi
  sleep 0.1
done
[[ $training -eq 1 ]] || fail "worker 1 never reported a step"
kill -9 "${TASK_PIDS[3]}"
killed_at=$(date +%s.%N)
on 1 "$PSTRAIN" wait "$JOB" --coordinator=$COORD --wait_poll_ms=100 \
  >"$TMP/wait2.txt" 2>&1
code=$?
ended_at=$(date +%s.%N)
tail -3 "$TMP/wait2.txt"
seconds=$(awk -v a="$killed_at" -v b="$ended_at" 'BEGIN { printf "%.1f", b - a }')
[[ $code -eq 1 ]] || fail "pstrain wait $JOB exited $code, expected 1"
# Named by its lost heartbeats or, sooner, by the shard whose barrier its
# broken stream broke.
grep -Eq "$JOB FAILED .*(lost worker 1 on 10\.77\.0\.5: no heartbeat for [0-9]+ s|worker 1 on 10\.77\.0\.5:[0-9]+: its push/pull stream)" \
  "$TMP/wait2.txt" || fail "the failure does not name worker 1 on 10.77.0.5"
awk -v s="$seconds" -v t=$HEARTBEAT_TIMEOUT_S 'BEGIN { exit !(s <= t + 3) }' ||
  fail "FAILED after $seconds s, beyond the heartbeat timeout $HEARTBEAT_TIMEOUT_S s + 3 s"
for pid in "${TASK_PIDS[@]:0:3}"; do
  wait_exit "$pid" 15 || fail "task pid $pid still running after the failure"
done
for i in 2 3 4 5; do
  left="$(ip netns pids "$(host_ns "$i")")"
  [[ -z "$left" ]] || fail "host 10.77.0.$i still runs: $left"
done
echo "job 2: FAILED $seconds s after the kill (heartbeat timeout $HEARTBEAT_TIMEOUT_S s), no task left"

# --- 3. One pstrain node agent per host, no launcher ----------------------
# Each agent finds its tasks by its namespace's address (10.77.0.2-5 in the
# spec's hosts) and gives its worker its cores: pinned to one core each
# (taskset), as on a node of its own, so the two workers do not fight over
# this machine's cores.
write_spec "$TMP/agents.pbtxt" 1
JOB="$(on 1 "$PSTRAIN" submit "$TMP/agents.pbtxt" --coordinator=$COORD)"
echo "submitted $JOB (1 epoch); one pstrain node agent on each of hosts 2-5"
AGENT_PIDS=()
for i in 2 3 4 5; do
  on "$i" taskset -c $((i % 2)) "$PSTRAIN" node --coordinator=$COORD \
    --job="$JOB" >"$TMP/agent$i.log" 2>&1 &
  AGENT_PIDS+=($!)
  PIDS+=($!)
  disown
done
on 1 "$PSTRAIN" wait "$JOB" --coordinator=$COORD >"$TMP/wait3.txt" 2>&1
code=$?
tail -3 "$TMP/wait3.txt"
[[ $code -eq 0 ]] || fail "pstrain wait $JOB (agents) exited $code"
for i in 2 3 4 5; do
  task=$([[ $i -le 3 ]] && echo "ps$((i - 2))" || echo "worker$((i - 4))")
  grep -q "started $task" "$TMP/agent$i.log" ||
    fail "the agent on 10.77.0.$i did not start $task: $(head -3 "$TMP/agent$i.log")"
done
grep -q "^\[worker1\] worker 1 of $JOB: 1 thread (--threads)" "$TMP/agent5.log" ||
  fail "worker 1 was not given 1 thread by its agent: $(grep -m1 thread "$TMP/agent5.log")"
for pid in "${AGENT_PIDS[@]}"; do
  wait_exit "$pid" 15 || fail "agent pid $pid still running after the job"
done
grep -q "all 1 tasks of this node exited 0" "$TMP/agent4.log" ||
  fail "the agent on 10.77.0.4 did not end cleanly: $(tail -2 "$TMP/agent4.log")"
echo "job 3: SUCCEEDED through 4 pstrain node agents, every agent exited"

if [[ $FAILURES -ne 0 ]]; then
  echo "--- logs ---"
  tail -n 5 "$TMP"/*.log
  echo "FAILED: $FAILURES check(s)"
  exit 1
fi
echo "PASSED"
