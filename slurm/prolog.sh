#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=...): guardctl's quick node checks before a job starts.
# On a failure guardctl drains the node with a 'guardctl: prolog: ...' reason, writes it to
# the job's stderr file (as the job's user), and this script exits 1: Slurm requeues the job
# (held). Where guardctl does not drain the node (hook.sh says when) it passes with an alert.
# The checks and their environment are described in hook.sh beside this file.
# Not exec: a site's script that runs or sources this one (". prolog.sh") keeps control and
# gets hook.sh's status (0: pass, 1: drained by guardctl) as this file's.
/bin/bash "${BASH_SOURCE[0]%/*}/hook.sh" prolog
