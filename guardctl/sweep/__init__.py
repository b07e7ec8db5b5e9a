"""Node sweeps: burn-in and all-reduce jobs that qualify suspect nodes before they return.

One plugin per sweep in :mod:`guardctl.sweep.plugins` (build the job, parse its
output, judge the result); :mod:`guardctl.sweep.pairing` finds bad nodes among
many suspects in few multi-node rounds; :mod:`guardctl.sweep.engine` runs the
whole thing through Slurm (quarantine, jobs, judgement, drain or release).
"""

from guardctl.sweep.registry import Measurement, SweepPlugin, get, names

__all__ = ["Measurement", "SweepPlugin", "get", "names"]
