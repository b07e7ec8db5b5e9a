"""Slurm hooks: quick node checks for the prolog, the epilog and HealthCheckProgram.

One check per file in :mod:`guardctl.hooks.checks`; :mod:`guardctl.hooks.run`
runs the checks a hook asks for and drains a failing node through the
controller (so that guardctl's ownership rules and action log hold).
"""
