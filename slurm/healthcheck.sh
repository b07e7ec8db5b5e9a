#!/bin/bash
# Slurm HealthCheckProgram: guardctl's quick checks on every node, every
# HealthCheckInterval. Slurm only logs its exit code: guardctl drains a failing node itself.
#
# The checks and their environment are described in hook.sh beside this file.
# Not exec: a site's script that runs or sources this one (". healthcheck.sh") keeps control and
# gets hook.sh's status (0: pass, 1: drained by guardctl) as this file's.
/bin/bash "${BASH_SOURCE[0]%/*}/hook.sh" healthcheck
