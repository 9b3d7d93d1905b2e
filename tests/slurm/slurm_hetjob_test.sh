#!/bin/bash
# Runs deploy/slurm/zo-offload.sbatch as a real heterogeneous job on a Slurm
# cluster started here: munged, slurmctld and two slurmds on this host, all
# with their files in a temp dir. Checks that the job trained (every worker
# finished its steps, the loss fell), that the servers were found from Slurm's
# node list and stopped gracefully, and that the job exited 0.
#
# usage: slurm_hetjob_test.sh SOURCE_DIR BIN_DIR
# Exit 77 (skipped) only when the daemons cannot be started.

set -uo pipefail
src=$1 bin=$2
readonly kSkip=77 kSteps=40 kJob=slurm-test

skip() { echo "SKIP: $*"; exit "$kSkip"; }

((EUID == 0)) || skip "slurmd must run as root to launch jobs (uid $EUID)"
for tool in munged mungekey slurmctld slurmd sbatch scontrol squeue sinfo scancel; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (apt-get install slurm-wlm munge)"
done

tmp=$(mktemp -d /tmp/zo-slurm-test.XXXXXX) || exit 1
# munged insists that everyone may traverse its socket's directory.
chmod 755 "$tmp"
conf=$tmp/slurm.conf
daemons=()  # pids of munged, slurmctld, slurmds, in start order
job=""

# Slurm commands see only this cluster; SLURM_CONF is not exported, so the
# environment sweep in cleanup matches only what the cluster started.
sl() { SLURM_CONF=$conf "$@"; }

# Polls a condition until it holds or `seconds` pass.
wait_for() {
  local seconds=$1 deadline
  shift
  deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

gone() { ! kill -0 "$1" 2>/dev/null; }
stop_pid() {
  kill -TERM "$1" 2>/dev/null || return 0
  wait_for 15 gone "$1" || kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
job_gone() { [[ -z $(sl squeue -h -j "$job" 2>/dev/null) ]]; }
ctld_up() { sl scontrol ping 2>/dev/null | grep -q UP; }

show_logs() {
  local f
  for f in "$tmp"/job.out "$tmp"/log/*; do
    [[ -s $f ]] && { echo "----- $f (last 40 lines)"; tail -n 40 "$f"; }
  done
}

cleanup() {
  local rc=$? i p
  ((rc == 0 || rc == kSkip)) || show_logs
  if [[ -n $job ]]; then
    sl scancel "$job" 2>/dev/null
    wait_for 20 job_gone
  fi
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do stop_pid "${daemons[i]}"; done
  # Last resort for step daemons and tasks the cluster left behind: they all
  # carry this cluster's SLURM_CONF in their environment.
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    ((p == $$)) && continue
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$conf" &&
      { echo "killing leftover pid $p"; kill -KILL "$p" 2>/dev/null; }
  done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Free ports: slurmctld, two slurmds, zo-server, and four consecutive ones for
# the stages of the four worker tasks on one node (all held at once so they
# are distinct). Below the kernel's ephemeral range: a port picked there and
# released can be taken by any outgoing connection (srun's, gRPC's) before
# the daemon or stage that was to listen on it binds.
read -r ctld_port slurmd_port1 slurmd_port2 zo_port stage_port < <(/usr/bin/python3 -c '
import random, socket
ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held = []
def run_of(n):
    while True:
        base = random.randrange(10000, ephemeral - n)
        try:
            for k in range(n):
                s = socket.socket(); s.bind(("", base + k)); held.append(s)
            return base
        except OSError:
            pass
ports = [run_of(1) for _ in range(4)]
print(*ports, run_of(4))')

# Two node names for one host, both resolvable: component 0 (servers) and
# component 1 (workers) must get different nodes, since the backfill
# scheduler, which starts heterogeneous jobs, reserves whole nodes.
node1=$(hostname -s) node2=localhost
[[ $node1 != "$node2" ]] || skip "hostname -s is localhost: no second node name for this host"
getent hosts "$node1" >/dev/null || skip "this host's name $node1 does not resolve"

mkdir -p "$tmp"/{log,state,metrics,ckpt} "$tmp/spool-$node1" "$tmp/spool-$node2"
mungekey --create --keyfile="$tmp/munge.key" >/dev/null 2>&1 ||
  dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge.key"
munged -F --key-file="$tmp/munge.key" --socket="$tmp/munge.sock" --pid-file="$tmp/munged.pid" \
  --seed-file="$tmp/munged.seed" --log-file="$tmp/log/munged.log" >"$tmp/log/munged.out" 2>&1 &
daemons+=($!)
wait_for 10 test -S "$tmp/munge.sock" || { show_logs; skip "munged did not start"; }

cat >"$conf" <<EOF
ClusterName=zotest
SlurmctldHost=$node1
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool-%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
# No cgroups, accounting or MPI: nothing outside the temp dir is needed.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Het jobs start only from the backfill scheduler: run it every second.
SchedulerParameters=bf_interval=1
# Each node claims 4 CPUs (this host may have 2) so 4 worker tasks fit.
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$node1 Port=$slurmd_port1 CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1
NodeName=$node2 Port=$slurmd_port2 CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1
PartitionName=cpu Nodes=$node1 Default=YES MaxTime=10 State=UP
PartitionName=gpu Nodes=$node2 MaxTime=10 State=UP
EOF

SLURM_CONF=$conf slurmctld -D -i >"$tmp/log/slurmctld.out" 2>&1 &
daemons+=($!)
wait_for 20 ctld_up || { show_logs; skip "slurmctld did not start"; }
for n in "$node1" "$node2"; do
  SLURM_CONF=$conf slurmd -D -N "$n" >"$tmp/log/slurmd-$n.out" 2>&1 &
  daemons+=($!)
done
nodes_idle() { [[ $(sl sinfo -h -N -t idle -o %N | sort -u | wc -l) == 2 ]]; }
wait_for 30 nodes_idle || { show_logs; skip "the slurmds did not register"; }
echo "cluster up: slurmctld :$ctld_port, nodes $node1 (partition cpu) and $node2 (partition gpu)"

# One server node, one worker node with 4 tasks: 2 dp ranks x 2 pipeline
# stages. No GPU here: no gres, CPU backend.
start=$SECONDS
job=$(cd "$tmp" && env SLURM_CONF="$conf" ZO_BIN_DIR="$bin" ZO_JOB=$kJob ZO_STEPS=$kSteps \
  ZO_PORT="$zo_port" ZO_STAGE_PORT="$stage_port" ZO_SERVER_NODES=1 ZO_SERVER_PARTITION=cpu \
  ZO_WORKER_NODES=1 ZO_WORKERS_PER_NODE=4 ZO_WORKER_CPUS=1 ZO_WORKER_GRES=none \
  ZO_WORKER_PARTITION=gpu ZO_DEVICE=cpu ZO_PIPELINE_STAGES=2 ZO_SERVER_THREADS=1 \
  ZO_METRICS_DIR="$tmp/metrics" ZO_CHECKPOINT_DIR="$tmp/ckpt" ZO_CHECKPOINT_EVERY=20 \
  ZO_READY_TIMEOUT=30 ZO_STOP_TIMEOUT=30 \
  ZO_TRAIN_ARGS="--n-layer 2 --n-embd 32 --n-head 2 --block-size 32 --blas-threads 1" \
  "$src/deploy/slurm/zo-offload.sbatch" --parsable --time=3 --output="$tmp/job.out")
job=${job%%;*}
[[ $job =~ ^[0-9]+$ ]] || { echo "FAIL: sbatch gave no job id: '$job'"; exit 1; }
echo "submitted job $job"

# The first component's record carries the batch script's state and exit code.
job_record() { sl scontrol -o show job "$job" 2>/dev/null | grep -m1 "HetJobOffset=0"; }
job_done() { [[ $(job_record) =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) ]]; }
wait_for 90 job_done || { echo "FAIL: job $job not done after 90 s: $(job_record)"; exit 1; }
record=$(job_record)
echo "job $job finished in $((SECONDS - start)) s: $(grep -o 'JobState=[A-Z_]*' <<<"$record") $(grep -o 'ExitCode=[0-9:]*' <<<"$record")"

failures=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
out=$tmp/job.out
check "job completed with exit code 0" grep -q "JobState=COMPLETED .*ExitCode=0:0" <<<"$record"
check "servers found from Slurm's node list and ready" grep -qx "zo-slurm: servers ready: $node1:$zo_port" "$out"
for task in 0 1 2 3; do
  check "worker task $task trained $kSteps steps" grep -q "^$task: trained $kSteps steps" "$out"
done
check "workers exited 0" grep -qx "zo-slurm: workers exited with status 0" "$out"
check "zo-server stopped on SIGTERM" grep -q "zo-server: SIGTERM, shutting down" "$out"
check "server step exited 0" grep -qx "zo-slurm: servers stopped with status 0" "$out"
check "servers wrote the checkpoint" test -f "$tmp/ckpt/$kJob/step-000000$kSteps/checkpoint.json"
# Tasks 1 and 3 are the last stages of dp ranks 0 and 1: they see the loss.
check "metrics: every step recorded, loss fell" /usr/bin/python3 - "$tmp/metrics" "$kSteps" <<'EOF'
import json, sys
root, steps = sys.argv[1], int(sys.argv[2])
ok = True
for task in range(4):
    rows = [json.loads(line) for line in open(f"{root}/metrics-{task}.jsonl")]
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        print(f"  task {task}: steps {[r['step'] for r in rows]}"); ok = False
    if task % 2 == 1:
        loss = [r["loss"] for r in rows]
        first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
        print(f"  task {task}: loss {first:.3f} (first 5 steps) -> {last:.3f} (last 5)")
        ok &= last < 0.85 * first
sys.exit(0 if ok else 1)
EOF

((failures == 0)) || { echo "$failures check(s) failed"; exit 1; }
echo "PASS"
