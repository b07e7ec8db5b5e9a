#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=...): the prolog's checks after a job, plus a
# summary of the finished job's stragglers from the probe's step records (in slurmd's log).
# On a failure guardctl drains the node and this script exits 1.
# The checks and their environment are described in hook.sh beside this file.
exec /bin/bash "${BASH_SOURCE[0]%/*}/hook.sh" epilog
