#!/bin/bash
# guardctl's Slurm hooks in one place: prolog.sh, epilog.sh and healthcheck.sh run this
# with their own name. On a failure guardctl drains the node itself (through its ownership
# rules) and this script exits 1; in a prolog that makes Slurm requeue the job elsewhere.
#
# Slurm runs hooks as root with an empty PATH and its own few variables; this script
# needs nothing else. Optional environment: GUARDCTL (the guardctl program),
# GUARDCTL_CONFIG (a config file beyond /etc/guardctl), GUARDCTL_HOOK_TIMEOUT (seconds,
# default 20: well under Slurm's limits). If guardctl is missing or hangs, the hook
# passes: an uninstalled or stuck checker must never drain the fleet.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
hook=${1:?usage: hook.sh prolog|epilog|healthcheck}
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
