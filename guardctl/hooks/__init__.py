"""Slurm hooks: quick node checks for the prolog, the epilog and HealthCheckProgram.

One check per file in :mod:`guardctl.hooks.checks`; :mod:`guardctl.hooks.run`
runs the checks a hook asks for and drains a failing node through the node-action
door (so that guardctl's ownership rules, cap and action log hold); where guardctl
does not drain it, the hook passes with an alert rather than let Slurm drain it.
"""
