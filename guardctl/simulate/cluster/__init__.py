"""A discrete-event simulation of a GPU cluster over days: what each mitigation policy buys.

``guardctl simulate cluster`` runs it. One concern per module:

* :mod:`.params`: the cluster, its jobs and its fault rates, each with its source;
* :mod:`.faults`: the fault schedule of one seed (the same for every policy);
* :mod:`.jobs`: a job's piecewise-constant speed, progress, checkpoints and losses;
* :mod:`.engine`: the event loop over the in-memory Slurm, and what policies may do;
* :mod:`.policies`: no mitigation, fail-stop checks, a Guard-style baseline, and guardctl's
  real controller (``classify``, ``decide``, the ladder) acting through ``NodeOps``;
* :mod:`.metrics`: goodput, step-time variation, losses, drains, nodes out of service;
* :mod:`.run`: one run, and policies compared over seeds;
* :mod:`.report`: the table and the plots.
"""
