"""A discrete-event simulation of a GPU cluster over days: what each mitigation policy buys.

``guardctl simulate cluster`` runs it. One concern per module:

* :mod:`.params`: the cluster, its jobs and its fault rates, each with its source;
* :mod:`.faults`: the fault schedule of one seed (the same for every policy), node faults
  and, with ``Params.fabric``, fabric faults (a degraded leaf, a flapping uplink, a congested
  spine group, a bad cable);
* :mod:`.fabric`: the network tree the nodes hang from (leaves, spine groups);
* :mod:`.jobs`: a job's piecewise-constant speed, progress, checkpoints and losses;
* :mod:`.engine`: the event loop over the in-memory Slurm, and what policies may do;
* :mod:`.policies`: no mitigation, fail-stop checks, a Guard-style baseline, and guardctl's
  real controller (``classify``, ``decide``, the ladder) acting through ``NodeOps``, without
  the tree (today's node-only controller) and with it (fabric localisation);
* :mod:`.metrics`: goodput, step-time variation, losses, drains, nodes out of service;
* :mod:`.run`: one run, and policies compared over seeds;
* :mod:`.report`: the table and the plots.
"""
