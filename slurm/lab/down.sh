#!/usr/bin/env bash
# Stop a local Slurm lab started by slurm/lab/up.sh.
#
# Usage: slurm/lab/down.sh [--dir DIR | --release R] [--all] [--purge]
#
#   --dir DIR  the lab started with `up.sh --dir DIR` (default: the default lab,
#              /etc/slurm/slurm.conf with its state in /var/lib/guardctl-lab)
#   --release R  the default lab of release R (/var/lib/guardctl-lab-R)
#   --all      also stop munged, if a lab started it and no other running lab
#              instance still uses it
#   --purge    also remove the lab's slurm.conf and its state, spool, run
#              and log directories (and the home dir itself if then empty)
#
# Only processes named in the lab's PID files are stopped (never by name).
# Running jobs of the lab are cancelled first and their slurmstepd processes,
# found by the lab's SLURM_CONF in their environment, are ended.  Idempotent.
set -euo pipefail

readonly REGISTRY=/run/guardctl-lab
readonly MUNGE_PIDFILE=/run/munge/munged.pid

dir=""
all=0
purge=0
release=""

die() {
    local rc=$1
    shift
    printf 'down.sh: error: %s\n' "$*" >&2
    exit "$rc"
}
log() { printf 'down.sh: %s\n' "$*" >&2; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --dir)
            [[ $# -ge 2 && -n $2 ]] || die 2 "option --dir needs a value"
            case $2 in /*) dir=$2 ;; *) dir=$PWD/$2 ;; esac
            shift 2
            ;;
        --all) all=1; shift ;;
        --purge) purge=1; shift ;;
        --release)
            [[ $# -ge 2 && -n $2 ]] || die 2 "option --release needs a value"
            release=$2
            shift 2
            ;;
        -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die 2 "unknown argument: $1 (see --help)" ;;
    esac
done

if [[ -n $dir ]]; then
    home=$dir
    conf=$dir/slurm.conf
elif [[ -n $release ]]; then
    home=/var/lib/guardctl-lab-$release
    conf=$home/slurm.conf
else
    home=/var/lib/guardctl-lab
    conf=/etc/slurm/slurm.conf
fi
export PATH=$PATH:/usr/sbin:/sbin

if [[ -e $conf ]]; then
    first_line=""
    IFS= read -r first_line <"$conf" || true
    [[ $first_line == "# guardctl-lab:"* ]] ||
        die 3 "$conf was not written by the guardctl lab; refusing to touch it"
fi

if [[ ! -d $home ]]; then
    log "no lab at $home; nothing to do"
    exit 0
fi

[[ $(id -u) -eq 0 ]] || die 4 "must run as root"

# A lab of another release runs in a Debian root (see release.sh); its clients are in HOME/bin.
root=""
if [[ -r $home/lab.release ]]; then
    root=$(sed -n 's/^root=//p' "$home/lab.release")
fi
if [[ -n $root ]]; then
    # shellcheck source=slurm/lab/release.sh
    . "$(dirname "${BASH_SOURCE[0]}")/release.sh"
    bin=$home/bin/
else
    bin=""
fi

# pid_of PIDFILE COMM: print the pid if PIDFILE names a live (non-zombie)
# process called COMM.
pid_of() {
    local pidfile=$1 comm=$2 pid state
    [[ -r $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && -r /proc/$pid/stat ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)
    [[ $state != Z ]] || return 1
    printf '%s\n' "$pid"
}

is_zombie() { [[ $(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) == Z ]]; }

# stop_pid PID: SIGTERM, wait up to 10 s, then SIGKILL.
stop_pid() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        [[ -d /proc/$pid ]] || return 0
        is_zombie "$pid" && return 0
        sleep 0.1
    done
    log "pid $pid ignored SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

stop_pidfile() {
    local pidfile=$1 comm=$2 pid
    if pid=$(pid_of "$pidfile" "$comm"); then
        log "stopping $comm (pid $pid)"
        stop_pid "$pid"
    fi
    rm -f "$pidfile"
}

# Pids of the lab's leftover job processes: slurmstepd and job processes whose
# environment carries SLURM_CONF=$conf (and, for job processes, SLURM_JOB_ID),
# excluding this script and its ancestors.
lab_leftovers() {
    local f pid skip=" " q=$BASHPID
    while [[ -n $q && $q != 0 && $q != 1 ]]; do
        skip+="$q "
        q=$(sed 's/^.*) //' "/proc/$q/stat" 2>/dev/null | cut -d' ' -f2)
    done
    while IFS= read -r f; do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [[ $skip == *" $pid "* ]] && continue
        if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmstepd ]] ||
            grep -qz '^SLURM_JOB_ID=' "$f" 2>/dev/null; then
            is_zombie "$pid" || printf '%s\n' "$pid"
        fi
    done < <(grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null || true)
}

(
    flock -w 120 8 || die 6 "another up.sh/down.sh holds $home/.lock"

    ctld=$home/run/slurmctld.pid
    if pid_of "$ctld" slurmctld >/dev/null; then
        # Cancel the lab's jobs so their steps end cleanly.
        jobs=$(SLURM_CONF=$conf timeout 10 ${bin}squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            # shellcheck disable=SC2086 # word splitting of job ids intended
            SLURM_CONF=$conf timeout 10 ${bin}scancel $jobs 2>/dev/null || true
            for _ in $(seq 1 30); do
                [[ -z $(SLURM_CONF=$conf timeout 10 ${bin}squeue -h -o %i 2>/dev/null || true) ]] && break
                sleep 0.2
            done
        fi
    fi

    for f in "$home"/run/slurmd-*.pid; do
        [[ -e $f ]] && stop_pidfile "$f" slurmd
    done
    stop_pidfile "$ctld" slurmctld

    leftovers=$(lab_leftovers)
    if [[ -n $leftovers ]]; then
        log "ending leftover job processes of the lab: $(tr '\n' ' ' <<<"$leftovers")"
        # shellcheck disable=SC2086 # word splitting of pids intended
        kill -TERM $leftovers 2>/dev/null || true
        for _ in $(seq 1 10); do
            [[ -z $(lab_leftovers) ]] && break
            sleep 0.1
        done
        leftovers=$(lab_leftovers)
        # shellcheck disable=SC2086 # word splitting of pids intended
        [[ -z $leftovers ]] || kill -KILL $leftovers 2>/dev/null || true
    fi

    rm -f "$REGISTRY/instances/$(printf '%s' "$home" | md5sum | cut -c1-16)"
    if [[ -n $root ]]; then
        release_root "$root" "$home"
    fi

    if ((purge)); then
        log "purging $home"
        rm -rf "$home/state" "$home/spool" "$home/run" "$home/log" "$home/bin"
        rm -f "$conf" "$home/cgroup.conf" "$home/lab.release"
    fi
) 8>"$home/.lock"

if ((purge)); then
    rm -f "$home/.lock"
    rmdir "$home" 2>/dev/null || true
fi

if ((all)); then
    mkdir -p "$REGISTRY"
    (
        flock -w 60 9 || die 6 "timed out waiting for $REGISTRY/munge.lock"
        if [[ ! -s $REGISTRY/munged.started-by ]]; then
            log "munged was not started by a lab; leaving it running"
            exit 0
        fi
        # Any other lab instance with a live controller still needs munged.
        for inst in "$REGISTRY"/instances/*; do
            [[ -e $inst ]] || continue
            other=$(sed -n 's/^home=//p' "$inst")
            if [[ -n $other ]] && pid_of "$other/run/slurmctld.pid" slurmctld >/dev/null; then
                log "munged still used by the lab at $other; leaving it running"
                exit 0
            fi
        done
        if pid=$(pid_of "$MUNGE_PIDFILE" munged); then
            log "stopping munged (pid $pid)"
            stop_pid "$pid"
        fi
        rm -f "$REGISTRY/munged.started-by"
    ) 9>"$REGISTRY/munge.lock"
fi

log "lab at $home is down"
