#!/bin/bash
# Slurm HealthCheckProgram: guardctl's quick checks on every node, every
# HealthCheckInterval. Slurm only logs its exit code: guardctl drains a failing node itself.
#
# The checks and their environment are described in hook.sh beside this file.
exec /bin/bash "${BASH_SOURCE[0]%/*}/hook.sh" healthcheck
