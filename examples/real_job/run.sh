#!/usr/bin/env bash
# The loop on a real job: an agent per node, a user's training job with one node's ranks really
# slow, and the controller as a daemon finding that node and quarantining it with nobody in the
# loop.  See README.md beside this script.
#
# Run as root on the lab (or a test cluster) whose slurm.conf SLURM_CONF names:
#   SLURM_CONF=/tmp/lab/slurm.conf examples/real_job/run.sh
#
# Settings (environment):
#   REAL_JOB_DIR  where the store, the configuration and the logs go (/var/tmp/guardctl-real-job)
#   JOB_USER      the ordinary user who submits the job (guardctl-user); as root it is run
#                 through runuser, as anyone else the job is the caller's own
#   NODES         the job's nodes, node1..nodeN (4)
#   SLOW_NODE     the node whose ranks compute SLOW_FACTOR times longer (node3, 3)
#   WINDOW_S      the analyzer's window; a node is judged after persist_k (2) such windows (10)
#   INTERVAL_S    the controller's pause between passes (3)
#   JOB_SECONDS   how long the job trains (180); TIMEOUT_S how long to wait for the finding (150)
#   PYTHON, GUARDCTL   the Python the ranks run, the guardctl the agents and controller run
# Exit 0 when SLOW_NODE was quarantined (and nothing else was), 1 when not within TIMEOUT_S.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
: "${SLURM_CONF:?set SLURM_CONF to the slurm.conf of the cluster}"
export SLURM_CONF
DIR=${REAL_JOB_DIR:-/var/tmp/guardctl-real-job}
JOB_USER=${JOB_USER:-guardctl-user}
NODES=${NODES:-4}
SLOW_NODE=${SLOW_NODE:-node3}
SLOW_FACTOR=${SLOW_FACTOR:-3}
WINDOW_S=${WINDOW_S:-10}
INTERVAL_S=${INTERVAL_S:-3}
JOB_SECONDS=${JOB_SECONDS:-180}
TIMEOUT_S=${TIMEOUT_S:-150}
PYTHON=${PYTHON:-python3}
GUARDCTL=${GUARDCTL:-guardctl}
STORE=$DIR/store
CONFIG=$DIR/guardctl.toml
say() { printf '%s real_job: %s\n' "$(date +%T)" "$*"; }

# 1. The administrator's part, once: the shared store, laid out for root-run daemons and for
#    users' jobs (steps/ 1777), and guardctl's configuration.
install -d -m 0755 "$DIR"
"$GUARDCTL" store init "$STORE"
bin_line=""  # a lab of another Slurm release: its clients
[[ -z ${SLURM_BIN_DIR:-} ]] || bin_line="bin_dir = \"$SLURM_BIN_DIR\""
cat >"$CONFIG" <<END
[store]
root = "$STORE"
[slurm]
conf = "$SLURM_CONF"
$bin_line
[safety]
max_out_fraction = 0.5
max_out_nodes = 2
[analyze]
# A node is a suspect once flagged in persist_k of the last persist_n windows: with these,
# about persist_k x window_s = $((2 * WINDOW_S)) s of its job's steps (the defaults: 300 s windows,
# 10 minutes).
window_s = $WINDOW_S
persist_k = 2
persist_n = 3
[agent]
interval_s = 2.0
# The store is appended to every 10 s by default: as often as a sample here, for 8 s windows.
write_interval_s = 2.0
# The lab's nodes share one host: each agent listens for its own node's ranks.
handoff_socket = "$DIR/agent-{node}.sock"
# No InfiniBand here: a recorded sysfs tree of 8 healthy NDR ports.
sysfs_root = "$repo/tests/fixtures/sysfs/ib8"
[control]
interval_s = $INTERVAL_S
lease_s = 30.0
sweep_kind = "single"
sweep_duration_s = 2.0
END

pids=()
job=""
cleanup() {
    local pid
    # The job first, then the agents: its ranks hand their last steps to the agents at exit.
    if [[ -n $job ]]; then
        scancel "$job" 2>/dev/null || true
        for _ in $(seq 100); do [[ -z $(squeue -h -j "$job" 2>/dev/null) ]] && break; sleep 0.2; done
    fi
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# 2. An agent per node, each with its own status file and rank socket (the lab's nodes share
#    one host).
for i in $(seq 1 "$NODES"); do
    "$GUARDCTL" --config "$CONFIG" --set agent.status_file="$DIR/agent-node$i.json" \
        agent --node "node$i" >"$DIR/agent-node$i.log" 2>&1 &
    pids+=($!)
done

# Each agent's socket before the job starts: a rank that finds none writes the store itself.
for i in $(seq 1 "$NODES"); do
    for _ in $(seq 150); do [[ -S $DIR/agent-node$i.sock ]] && break; sleep 0.2; done
    [[ -S $DIR/agent-node$i.sock ]] || say "node$i's agent has no socket yet: its ranks write the store"
done

# 3. The user's job: a rank per node; SLOW_NODE's ranks really compute slower.
submit=()
if [[ $(id -u) == 0 ]]; then
    install -d -m 0755 -o "$JOB_USER" "$DIR/jobs"
    submit=(runuser -u "$JOB_USER" --)
else
    install -d -m 0755 "$DIR/jobs"
fi
args="--seconds $JOB_SECONDS --slow-node $SLOW_NODE --slow-factor $SLOW_FACTOR"
job=$(cd "$DIR/jobs" && "${submit[@]}" sbatch --parsable -N "$NODES" -w "node[1-$NODES]" \
    -o "$DIR/jobs/train-%j.out" \
    --export="ALL,GUARDCTL_STORE=$STORE,GUARDCTL_AGENT_SOCKET=$DIR/agent-{node}.sock,PYTHON=$PYTHON,TRAIN=$here/train.py,TRAIN_ARGS=$args" \
    "$here/job.sbatch")
job=${job%%;*}
until [[ $(squeue -h -j "$job" -o %T) == RUNNING ]]; do sleep 0.5; done
started=$SECONDS
say "job $job of $JOB_USER runs on node[1-$NODES]; $SLOW_NODE's ranks ${SLOW_FACTOR}x slow"

# 4. The controller as a daemon, as the systemd unit in contrib/ runs it: nobody in the loop.
"$GUARDCTL" --config "$CONFIG" control --act --interval "$INTERVAL_S" \
    >"$DIR/controller.log" 2>&1 &
pids+=($!)

# 5. Watch Slurm until the controller has quarantined the slow node.
while ((SECONDS - started < TIMEOUT_S)); do
    if scontrol show reservation "guardctl_q_$SLOW_NODE" >/dev/null 2>&1; then
        say "$SLOW_NODE quarantined $((SECONDS - started)) s after the job started;" \
            "job $job: $(squeue -h -j "$job" -o %T)"
        "$GUARDCTL" --config "$CONFIG" history --control --limit 10 || true
        exit 0
    fi
    sleep 1
done
say "$SLOW_NODE not quarantined within ${TIMEOUT_S}s; see $DIR/controller.log"
tail -n 20 "$DIR/controller.log" >&2
exit 1
