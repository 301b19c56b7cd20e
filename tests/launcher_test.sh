#!/bin/bash
# README's cluster quick starts, run word for word under real launchers on
# this machine:
#
#   1. Slurm: the test configures and starts its own munged, slurmctld and
#      slurmd (Debian's slurm-wlm 22.05 and munge) on 127.0.0.1, in a
#      temporary folder and on free ports, and runs README's Slurm block
#      (pstrain install, submit, launch-lines --sbatch, sbatch --wait,
#      pstrain wait) for a 2 PS + 2 worker LeNet-5 job;
#   2. Open MPI: README's mpirun block (launch-lines --launcher=mpirun, one
#      mpirun per role from a hostfile, bash launch.sh) for the same job with
#      its hosts listed.
#   3. The same job through one `pstrain node` agent per node (README's
#      slurm-node and mpirun-node blocks: srun --ntasks-per-node=1, mpirun
#      --map-by ppr:1:node).
# Each job must end SUCCEEDED with the test accuracy of `pstrain run` for
# the same job. Then a job whose workers fail (a data_dir that does not
# exist) under each launcher: the printed script must exit non-zero naming
# the worker tasks. Where a scheduler cannot start (not root, a package
# missing, a daemon that does not come up), that part prints
# "SKIP: <launcher>: <reason>" and the rest goes on; scripts/test.sh shows
# the SKIP lines.
#
# Run by hand: bash tests/launcher_test.sh [BIN_DIR]   (default: bazel-bin)
# or through Bazel: bazel test //tests:launcher_test. STEPS=N (default 300)
# sets the steps per worker, for the data/sec figures of BENCHMARKS.md.
set -u

if [[ -n "${TEST_SRCDIR:-}" ]]; then
  BIN="$(pwd)"
  README="$BIN/README.md"
else
  BIN="$(cd "${1:-bazel-bin}" && pwd)"
  README="$(cd "$(dirname "$0")/.." && pwd)/README.md"
fi
DATA=/usr/share/datasets/fashion-mnist
STEPS="${STEPS:-300}"
for b in cli/pstrain coordinator/pstrain_coordinator server/pstrain_ps \
  worker/pstrain_worker; do
  [[ -x "$BIN/$b" ]] || { echo "FAIL: $BIN/$b is not built"; exit 1; }
done
if [[ ! -f "$DATA/train-images-idx3-ubyte.gz" ]]; then
  echo "SKIP: dataset-fashion-mnist is not installed"
  exit 0
fi

TMP="$(mktemp -d /tmp/pstrain-launcher-XXXXXX)"
PIDS=()
SLURM_DIR="$TMP/slurm"
cleanup() {
  if [[ -f "$SLURM_DIR/slurmctld.pid" ]]; then
    scancel --full --signal=KILL >/dev/null 2>&1
    for f in slurmd slurmctld munged; do
      [[ -f "$SLURM_DIR/$f.pid" ]] && kill "$(cat "$SLURM_DIR/$f.pid")" 2>/dev/null
    done
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  sleep 0.5
  rm -rf "$TMP"
}
trap cleanup EXIT

FAILURES=0
fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# README's blocks, as `bazel-bin/...` reads from a workspace: a bazel-bin
# beside the job files.
WORK="$TMP/work"
mkdir -p "$WORK"
ln -s "$BIN" "$WORK/bazel-bin"
export PREFIX="$TMP/opt/pstrain"

# readme_block NAME: the ```sh block after "<!-- launcher_test: NAME -->".
readme_block() {
  awk -v tag="<!-- launcher_test: $1 -->" '
    $0 == tag { found = 1; next }
    found && /^```sh$/ { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$README"
}

# The job: LeNet-5 on Fashion-MNIST, 2 PS, 2 workers, $STEPS steps.
write_spec() {  # write_spec FILE [EXTRA FIELDS...]
  local file="$1"
  shift
  {
    echo 'model: "lenet5" dataset: "fashion_mnist" mode: "sync"'
    echo 'num_ps: 2 num_workers: 2 batch_size: 64 epochs: 1'
    echo "max_steps_per_epoch: $STEPS log_every_steps: 100"
    for line in "$@"; do echo "$line"; done
  } >"$file"
}
HOSTS=('ps_hosts { host: "127.0.0.1" }' 'ps_hosts { host: "127.0.0.1" }'
  'worker_hosts { host: "127.0.0.1" }' 'worker_hosts { host: "127.0.0.1" }')

# The reference: the same job under `pstrain run` (each worker 1 thread on
# 2 cores, as under the launchers below).
REF_LOG="$TMP/run.log"
"$BIN/cli/pstrain" run --num_ps=2 --num_workers=2 --batch_size=64 \
  --epochs=1 --max_steps_per_epoch="$STEPS" --log_every_steps=100 >"$REF_LOG" 2>&1
# accuracy LOG: the last column of the results table.
accuracy() { grep -E '^\| 2 \| 2 \| sync' "$1" | tail -1 | awk -F'|' '{gsub(/ /,"",$11); print $11}'; }
# data_per_sec LOG: the mean of the StepN lines' data/sec.
data_per_sec() {
  grep -oE 'Step[0-9]+: [0-9.]+ data/sec' "$1" |
    awk '{s += $2; n++} END {if (n) printf "%.0f", s / n}'
}
REF_ACC="$(accuracy "$REF_LOG")"
if [[ -z "$REF_ACC" ]]; then
  fail "pstrain run: no results table"
  cat "$REF_LOG"
  exit 1
fi
echo "pstrain run: test accuracy $REF_ACC, $(data_per_sec "$REF_LOG") data/sec"

# Close enough to pstrain run's accuracy: equal to 0.005 (the workers' thread
# counts may differ on bigger machines, and with them oneDNN's rounding).
same_accuracy() {
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d < 0.005 && d > -0.005) }'
}

# Mutual TLS as README's head-node block sets it up: every process the
# quick starts launch (through sbatch, mpirun or pstrain node) inherits
# PSTRAIN_TLS_DIR.
"$BIN/cli/pstrain" certs --out="$TMP/tls" --num_ps=8 --num_workers=8 \
  >/dev/null || fail "pstrain certs"
export PSTRAIN_TLS_DIR="$TMP/tls"

# The coordinator the quick starts talk to.
COORD_PORT="$(free_port)"
export COORD="127.0.0.1:$COORD_PORT"
"$BIN/coordinator/pstrain_coordinator" --bind=127.0.0.1 --port="$COORD_PORT" \
  >"$TMP/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
  "$BIN/cli/pstrain" status --coordinator="$COORD" >/dev/null 2>&1 && break
  sleep 0.1
done

# check_run NAME LOG STATUS: the quick start exited 0, the job SUCCEEDED
# with pstrain run's accuracy.
check_run() {
  local name="$1" log="$2" status="$3"
  local acc
  acc="$(accuracy "$log")"
  if [[ "$status" != 0 ]]; then
    fail "$name: the quick start exited $status"
    tail -40 "$log"
  elif ! grep -q ' SUCCEEDED ' "$log"; then
    fail "$name: the job did not succeed"
    tail -40 "$log"
  elif [[ -z "$acc" ]] || ! same_accuracy "$acc" "$REF_ACC"; then
    fail "$name: test accuracy '$acc', pstrain run's $REF_ACC"
  else
    echo "PASS: $name: SUCCEEDED, test accuracy $acc (pstrain run $REF_ACC), $(data_per_sec "$log") data/sec; threads: $(grep -ohE 'worker [0-9] of job-[0-9]+: [0-9]+ threads? \([^)]*\)' "$log" | sort -u | tr '\n' ';')"
  fi
}

# check_failure NAME LOG STATUS: the script exited non-zero naming the
# launcher command that failed first. That is the workers' step, or the
# shards' when they end (the coordinator failed the job) before the workers'
# launcher has finished reporting (mpirun first stops the other ranks); the
# workers' own error must be in the log either way.
check_failure() {
  local name="$1" log="$2" status="$3"
  if [[ "$status" == 0 ]]; then
    fail "$name: the script exited 0 although the workers failed"
    tail -20 "$log"
  elif ! grep -qE '^launch: FAILED: (worker|ps) tasks .* exited with status [1-9]' "$log"; then
    fail "$name: no line naming the failed launcher command"
    tail -20 "$log"
  elif ! grep -q '/nonexistent' "$log"; then
    fail "$name: the workers' error (their data_dir) is not in the output"
    tail -20 "$log"
  else
    echo "PASS: $name: exit $status, $(grep -E '^launch: FAILED' "$log")"
  fi
}

# --- Slurm ------------------------------------------------------------------
start_slurm() {  # prints the reason on failure
  local sbin=/usr/sbin
  if [[ "$(id -u)" != 0 ]]; then
    echo "slurmd must run as root here"
    return 1
  fi
  for b in $sbin/munged $sbin/slurmctld $sbin/slurmd; do
    [[ -x "$b" ]] || { echo "$b is missing (apt-get install munge slurmctld slurmd slurm-client)"; return 1; }
  done
  command -v sbatch >/dev/null || { echo "sbatch is missing (slurm-client)"; return 1; }
  mkdir -p "$SLURM_DIR"/{state,spool,munge}
  chmod 700 "$SLURM_DIR/munge"
  head -c 1024 /dev/urandom >"$SLURM_DIR/munge/munge.key"
  chmod 400 "$SLURM_DIR/munge/munge.key"
  if ! $sbin/munged --force --key-file="$SLURM_DIR/munge/munge.key" \
    --socket="$SLURM_DIR/munge/munge.sock" \
    --pid-file="$SLURM_DIR/munged.pid" \
    --log-file="$SLURM_DIR/munged.log" \
    --seed-file="$SLURM_DIR/munge/seed" >"$SLURM_DIR/munged.out" 2>&1; then
    echo "munged did not start: $(tail -1 "$SLURM_DIR/munged.out")"
    return 1
  fi
  local node
  node="$(hostname -s)"
  # 4 CPUs whatever the machine has (config_overrides): one per task.
  cat >"$SLURM_DIR/slurm.conf" <<EOF
ClusterName=pstrain$$
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  if ! $sbin/slurmctld -f "$SLURM_CONF" >"$SLURM_DIR/slurmctld.out" 2>&1; then
    echo "slurmctld did not start: $(tail -1 "$SLURM_DIR/slurmctld.out")"
    return 1
  fi
  if ! $sbin/slurmd -f "$SLURM_CONF" >"$SLURM_DIR/slurmd.out" 2>&1; then
    echo "slurmd did not start: $(tail -1 "$SLURM_DIR/slurmd.out")"
    return 1
  fi
  for _ in $(seq 60); do
    [[ "$(sinfo -h -o %T 2>/dev/null)" == idle ]] && return 0
    sleep 0.5
  done
  echo "the node did not become idle: $(sinfo -h -o '%T %E' 2>&1 | head -1); $(tail -1 "$SLURM_DIR/slurmd.log" 2>/dev/null)"
  return 1
}

SLURM_BLOCK="$(readme_block slurm)"
if [[ -z "$SLURM_BLOCK" ]]; then
  fail "README has no <!-- launcher_test: slurm --> block"
elif ! start_slurm >"$TMP/slurm_reason"; then
  # Not in a subshell: SLURM_CONF and SLURM_DIR stay set.
  echo "SKIP: slurm: $(cat "$TMP/slurm_reason")"
else
  echo "slurm: slurmctld and slurmd $(slurmctld -V | cut -d' ' -f2) up on 127.0.0.1"
  write_spec "$WORK/job.pbtxt"
  (cd "$WORK" && set -euo pipefail && eval "$SLURM_BLOCK") >"$TMP/slurm.log" 2>&1
  status=$?
  cat "$WORK"/slurm-*.out >>"$TMP/slurm.log" 2>/dev/null
  check_run "slurm (sbatch, srun --exact steps)" "$TMP/slurm.log" "$status"
  # A failing task: the workers cannot read their data.
  write_spec "$WORK/bad.pbtxt" 'data_dir: "/nonexistent"'
  JOB="$("$PREFIX/bin/pstrain" submit "$WORK/bad.pbtxt" --coordinator="$COORD")"
  "$PREFIX/bin/pstrain" launch-lines "$WORK/bad.pbtxt" --launcher=slurm \
    --coordinator="$COORD" >"$WORK/bad_slurm.sh"
  JOB="$JOB" timeout 120 bash "$WORK/bad_slurm.sh" >"$TMP/slurm_bad.log" 2>&1
  check_failure "slurm, failing workers" "$TMP/slurm_bad.log" "$?"
  # The same job through one pstrain node agent per node (here: one).
  rm -f "$WORK"/slurm-*.out
  (cd "$WORK" && set -euo pipefail && eval "$(readme_block slurm-node)") \
    >"$TMP/slurm_node.log" 2>&1
  status=$?
  cat "$WORK"/slurm-*.out >>"$TMP/slurm_node.log" 2>/dev/null
  check_run "slurm, pstrain node (srun --ntasks-per-node=1)" \
    "$TMP/slurm_node.log" "$status"
fi

# --- Open MPI ---------------------------------------------------------------
MPI_BLOCK="$(readme_block mpirun)"
if [[ -z "$MPI_BLOCK" ]]; then
  fail "README has no <!-- launcher_test: mpirun --> block"
elif ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun: mpirun is missing (apt-get install openmpi-bin)"
elif ! out="$(mpirun $([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root) -np 1 true 2>&1)"; then
  echo "SKIP: mpirun: mpirun -np 1 true fails here: $(echo "$out" | head -3 | tr '\n' ' ')"
else
  echo "mpirun: $(mpirun --version | head -1)"
  write_spec "$WORK/job.pbtxt" "${HOSTS[@]}"
  (cd "$WORK" && set -euo pipefail && eval "$MPI_BLOCK") >"$TMP/mpirun.log" 2>&1
  check_run "mpirun (hostfile 127.0.0.1 slots=2 per role)" "$TMP/mpirun.log" "$?"
  write_spec "$WORK/bad.pbtxt" 'data_dir: "/nonexistent"' "${HOSTS[@]}"
  JOB="$("$PREFIX/bin/pstrain" submit "$WORK/bad.pbtxt" --coordinator="$COORD")"
  "$PREFIX/bin/pstrain" launch-lines "$WORK/bad.pbtxt" --launcher=mpirun \
    --coordinator="$COORD" >"$WORK/bad_mpirun.sh"
  JOB="$JOB" timeout 120 bash "$WORK/bad_mpirun.sh" >"$TMP/mpirun_bad.log" 2>&1
  check_failure "mpirun, failing workers" "$TMP/mpirun_bad.log" "$?"
  write_spec "$WORK/job.pbtxt" "${HOSTS[@]}"
  (cd "$WORK" && set -euo pipefail && eval "$(readme_block mpirun-node)") \
    >"$TMP/mpirun_node.log" 2>&1
  check_run "mpirun, pstrain node (--map-by ppr:1:node)" \
    "$TMP/mpirun_node.log" "$?"
fi

if [[ $FAILURES -gt 0 ]]; then
  echo "launcher_test: $FAILURES failures"
  exit 1
fi
echo "launcher_test: passed"
