#!/usr/bin/env bash
# guardctl end to end on the local test cluster: telemetry, and the controller closing the loop
# by itself (analysis, quarantine, sweep, drain or release) with nobody in it.
#
# Run as root on a Debian 12 machine (a fresh one is fine: it installs what it needs).
# It starts an 8-node Slurm lab on loopback under $DEMO_DIR (default /var/tmp/guardctl-demo),
# leaves it running for you to explore, and prints how to stop it.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

DEMO_DIR=${DEMO_DIR:-/var/tmp/guardctl-demo}
LAB=$DEMO_DIR/lab
STORE=$DEMO_DIR/store
CONFIG=$DEMO_DIR/guardctl.toml
PORT=${DEMO_PORT:-16900}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# guardctl exits 1 when it finds something to act on: that is the point of the demo.
findings_ok() { local rc=0; "$@" || rc=$?; [[ $rc -le 1 ]] || exit "$rc"; }
g() { guardctl --config "$CONFIG" "$@"; }

step "0. Set-up: Slurm, munge, guardctl (tools/setup.sh), and an 8-node lab"
bash tools/setup.sh
mkdir -p "$DEMO_DIR"
# Start from a clean lab and an empty store each time: the demo owns both.
[[ -f $LAB/slurm.conf ]] && bash slurm/lab/down.sh --dir "$LAB" --purge
bash slurm/lab/up.sh --dir "$LAB" --port "$PORT" --cluster demo --nodes 8
export SLURM_CONF=$LAB/slurm.conf
rm -rf "$STORE" "$DEMO_DIR/live"
cat >"$CONFIG" <<END
# guardctl settings for the demo (see man -l man/guardctl.toml.5)
[store]
root = "$STORE"
[slurm]
conf = "$SLURM_CONF"
[safety]
max_out_fraction = 0.5
max_out_nodes = 3
[sweep]
gemm_threads = 1
allreduce_max_bytes = 4194304
tolerance = 0.7
# The lab's all-reduce shares two cores with everything else: judge it loosely.
references = { nccl = { lower = -0.8 }, pairwise = { lower = -0.8 } }
inject = { node3 = 0.3 }  # demo only: node3's burn-in really runs slow
[control]
sweep_kind = "all"
sweep_duration_s = 5.0
END
# The administrator marks the shared store once, at install time: the agent, the controller and
# the hooks refuse a store root without this marker (a shared filesystem that is not mounted).
run g store init "$STORE"
run g store init "$DEMO_DIR/live"
run sinfo

step "1. Telemetry: the node agent and the training-job probe, for real"
# This machine has no GPU: the NVML collector says so and the others go on. The InfiniBand
# collector reads a recorded sysfs tree of 8 NDR ports.
run g --set agent.sysfs_root="$repo/tests/fixtures/sysfs/ib8" --set agent.status_file='""' \
    agent --store "$DEMO_DIR/live" --node node1 --once
# The probe inside a real 2-node Slurm job: each rank times its steps into the store.
job=$(sbatch --parsable -N2 --ntasks-per-node=1 -o "$DEMO_DIR/probe-%j.out" \
      --export=ALL,GUARDCTL_STORE="$DEMO_DIR/live" --wrap "srun python3 -c '
from guardctl import probe
import time
for _ in range(50):
    with probe.step():
        time.sleep(0.01); probe.comm_begin(); time.sleep(0.005)
'")
while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
run g store check "$DEMO_DIR/live"

step "2. Baselines: sweep two healthy nodes once, so that a lone node's sweep has a reference"
findings_ok g sweep 'node[7-8]' --kind single --duration 5

step "3. The loop with nobody in it: a grey node inside a running job, and a benign confounder"
# The fleet's telemetry (simulated: no GPUs here, but schema v1 exactly, like the agent's):
# node3 has a silently slow GPU; node6 carries someone else's CPU load (a benign confounder).
run g simulate --out "$STORE" --names 'node[1-8]' --duration 30m --seed 1 \
    --faults 'slow_gpu@node3,host_contention@node6' --start "$(($(date +%s) - 1800))"
# A training job runs on node3 and node4 for 40 s.
train=$(sbatch --parsable -N2 -w 'node[3-4]' -J train -o /dev/null --wrap 'sleep 40')
while [[ $(squeue -h -j "$train" -o %T) != RUNNING ]]; do sleep 0.5; done
echo "training job $train runs on node[3-4]"
# The controller runs as a daemon (as the systemd unit in contrib/ would); from here on
# nobody types a command: it quarantines node3 at once (the job goes on), waits for the job,
# sweeps node3 (made really slow: a demo-only setting, honoured only because SLURM_CONF is the
# lab's: guardctl refuses it on any other cluster) and drains it, and only watches node6.
# (Not through g(): $! must be guardctl's own pid, not a subshell's, or the kill below would
# leave the daemon running on the lab.)
guardctl --config "$CONFIG" control --act --interval 3 >"$DEMO_DIR/controller.log" 2>&1 &
ctl=$!
trap 'kill "$ctl" 2>/dev/null || true' EXIT
last=""
for _ in $(seq 300); do
    now=$(g status node3 --json | python3 -c '
import json, sys
n = json.load(sys.stdin)["nodes"][0]
print(n["guardctl"], n["slurm_state"], n["reason"] or "")')
    [[ $now != "$last" ]] && echo "$(date +%T) node3: $now" && last=$now
    [[ $now == "drained by guardctl"* ]] && break
    sleep 1
done
kill "$ctl"; wait "$ctl" || true; trap - EXIT
echo "training job $train: $(scontrol show job -o "$train" 2>/dev/null | grep -o 'JobState=[A-Z]*' || echo ended)"
run tail -n 12 "$DEMO_DIR/controller.log"
step "   What the controller did, and why"
run g history --control
run g control --explain node3
run g control --explain node6
run sinfo -R

step "4. Ownership: a node an administrator drained is never touched"
run scontrol update NodeName=node8 State=DRAIN Reason="admin: replacing DIMM"
rc=0; g resume node8 || rc=$?
echo "(exit $rc: refused, node8 left exactly as the administrator set it)"

step "5. The job keeps going meanwhile: dynamic data sharding in a real Slurm job"
job=$(DDS_RECORDS=20000 DDS_SHARD=500 GUARDCTL_STORE="$STORE" \
      sbatch --parsable -o "$DEMO_DIR/dds-%j.out" examples/dds_job.sbatch)
while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
run g dds status "$job"

step "6. Reports: status, the action log, a health report with plots, Prometheus metrics"
run g status
run g history --limit 20
findings_ok g report --period 1h --format html --output "$DEMO_DIR/report.html"
findings_ok g report --period 1h --format md --output "$DEMO_DIR/report.md"
findings_ok g export --prometheus "$DEMO_DIR/guardctl.prom"
echo
echo "Report: $DEMO_DIR/report.html   Metrics: $DEMO_DIR/guardctl.prom   Store: $STORE"
echo "The loop on a real job, a user's, with one node's ranks really slow: examples/real_job/"
echo "The lab is still running (export SLURM_CONF=$SLURM_CONF). Stop it with:"
echo "  bash slurm/lab/down.sh --dir $LAB --purge"
