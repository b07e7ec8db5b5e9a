#!/usr/bin/env bash
# guardctl end to end on the local test cluster: telemetry, analysis, sweep, drain or release.
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
END
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

step "2. A fleet's telemetry with faults: 8 nodes x 8 GPUs, several jobs, benign confounders"
# The trace is simulated (no GPUs here) but follows schema v1 exactly, like the agent's.
# Two faults land on lab nodes: a GPU that is silently slow (node3) and rising link errors (node6).
run g simulate --out "$STORE" --names 'node[1-8]' --duration 30m --seed 1 \
    --faults 'slow_gpu@node3,link_errors@node6' --start "$(($(date +%s) - 1800))"

step "3. Analysis: compare every node with its peers, with persistence"
findings_ok g analyze
findings_ok g analyze --json >"$DEMO_DIR/analysis.json"
suspects=$(python3 -c '
import json, sys
nodes = json.load(open(sys.argv[1]))["nodes"]
print(",".join(n["node"] for n in nodes if n["verdict"] == "suspect"))' "$DEMO_DIR/analysis.json")
echo "suspects: $suspects"
[[ -n $suspects ]] || { echo "no suspects: nothing to sweep" >&2; exit 1; }

step "4. Sweep the suspects: quarantine, GEMM + all-reduce + pairwise jobs through sbatch, judge"
# Only node3 has the hardware fault: make its burn-in really run slow (a demo-only setting,
# honoured only because SLURM_CONF is the lab's: guardctl refuses it on any other cluster).
# node6's link errors were transient: its sweep passes and it goes back to production.
findings_ok g --set 'sweep.inject={node3=0.3}' sweep "node[${suspects//node/}]" --duration 5
run sinfo -R

step "5. Ownership: a node an administrator drained is never touched"
run scontrol update NodeName=node8 State=DRAIN Reason="admin: replacing DIMM"
rc=0; g resume node8 || rc=$?
echo "(exit $rc: refused, node8 left exactly as the administrator set it)"

step "6. The job keeps going meanwhile: dynamic data sharding in a real Slurm job"
job=$(DDS_RECORDS=20000 DDS_SHARD=500 GUARDCTL_STORE="$STORE" \
      sbatch --parsable -o "$DEMO_DIR/dds-%j.out" examples/dds_job.sbatch)
while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.5; done
run g dds status "$job"

step "7. Reports: status, the action log, a health report with plots, Prometheus metrics"
run g status
run g history --limit 20
findings_ok g report --period 1h --format html --output "$DEMO_DIR/report.html"
findings_ok g report --period 1h --format md --output "$DEMO_DIR/report.md"
findings_ok g export --prometheus "$DEMO_DIR/guardctl.prom"
echo
echo "Report: $DEMO_DIR/report.html   Metrics: $DEMO_DIR/guardctl.prom   Store: $STORE"
echo "The lab is still running (export SLURM_CONF=$SLURM_CONF). Stop it with:"
echo "  bash slurm/lab/down.sh --dir $LAB --purge"
