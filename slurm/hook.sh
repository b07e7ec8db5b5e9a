#!/bin/bash
# guardctl's Slurm hooks in one place: prolog.sh, epilog.sh and healthcheck.sh run this
# with their own name. On a failure guardctl drains the node itself (through its ownership
# rules and its cap) and this script exits 1; in a prolog that makes Slurm requeue the job
# elsewhere. Where guardctl did not drain the node (its cap is reached, Slurm or the store
# cannot be reached, a fleet-wide burst of one failing check) guardctl exits 0 with an alert:
# a non-zero exit would make Slurm drain the node itself, outside guardctl's cap.
#
# Slurm runs hooks as root with an empty PATH and its own few variables; this script
# needs nothing else. Optional environment: GUARDCTL (the guardctl program),
# GUARDCTL_CONFIG (a config file beyond /etc/guardctl), GUARDCTL_HOOK_TIMEOUT (seconds,
# default 20: well under Slurm's limits). If guardctl is missing, hangs or cannot run its
# checks (a bad configuration: exit 3), the hook passes and says so in slurmd's log and in
# syslog: an uninstalled, stuck or misconfigured checker must never drain the fleet.
#
# Chaining: it writes nothing on stdout (guardctl's lines go to stderr, which slurmd logs when a
# hook fails, and alerts to syslog), changes nothing in the caller's environment, and exits
# 0 (pass) or 1 (guardctl drained the node), so a site's wrapper or prolog.d directory can run
# it beside its own scripts.
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
alert() {
    echo "guardctl $hook: $1" >&2
    logger -t guardctl -p daemon.warning "guardctl $hook: $1" 2>/dev/null || true
}
if [[ -z $guardctl || ! -x $guardctl ]]; then
    alert "guardctl not found (set GUARDCTL); node checks skipped"
    exit 0
fi
timeout -k 5 "${GUARDCTL_HOOK_TIMEOUT:-20}" "$guardctl" hook "$hook" >&2
rc=$?
case $rc in
    0) exit 0 ;;
    1) exit 1 ;; # a check failed and guardctl drained the node
    124 | 137) alert "checks timed out; passing"; exit 0 ;;
    *) alert "guardctl exited $rc (checks could not run); passing"; exit 0 ;;
esac
