#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=...): the prolog's checks after a job, plus a
# summary of the finished job's stragglers from the probe's step records: in syslog (tag
# guardctl, facility daemon) after every job, since Slurm keeps an epilog's output only when it
# fails.
# On a failure guardctl drains the node and this script exits 1.
# The checks and their environment are described in hook.sh beside this file.
# Not exec: a site's script that runs or sources this one (". epilog.sh") keeps control and
# gets hook.sh's status (0: pass, 1: drained by guardctl) as this file's.
/bin/bash "${BASH_SOURCE[0]%/*}/hook.sh" epilog
