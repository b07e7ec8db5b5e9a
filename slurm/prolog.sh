#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=...): guardctl's quick node checks before a job starts.
# On a failure guardctl drains the node with a 'guardctl: prolog: ...' reason, writes it to
# the job's stderr file, and this script exits 1: Slurm requeues the job (held) elsewhere.
#
# Slurm runs hooks as root with an empty PATH and its own few variables; this script
# needs nothing else. Optional environment: GUARDCTL (the guardctl program),
# GUARDCTL_CONFIG (a config file beyond /etc/guardctl), GUARDCTL_HOOK_TIMEOUT (seconds,
# default 20: well under Slurm's limits). If guardctl is missing or hangs, the hook
# passes: an uninstalled or stuck checker must never drain the fleet.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
hook=prolog
guardctl=${GUARDCTL:-}
if [[ -z $guardctl ]]; then
    for candidate in /usr/local/bin/guardctl /usr/bin/guardctl /opt/guardctl/bin/guardctl; do
        if [[ -x $candidate ]]; then
            guardctl=$candidate
            break
        fi
    done
fi
if [[ -z $guardctl || ! -x $guardctl ]]; then
    echo "guardctl $hook: guardctl not found (set GUARDCTL); node checks skipped" >&2
    exit 0
fi
timeout -k 5 "${GUARDCTL_HOOK_TIMEOUT:-20}" "$guardctl" hook "$hook"
rc=$?
case $rc in
    0) exit 0 ;;
    1) exit 1 ;; # a check failed: guardctl drained the node (or said why it could not)
    124 | 137) echo "guardctl $hook: checks timed out; passing" >&2; exit 0 ;;
    *) echo "guardctl $hook: guardctl exited $rc; passing" >&2; exit 0 ;;
esac
