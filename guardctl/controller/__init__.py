"""The mitigation controller: guardctl closes the loop from the analyzer's verdicts to Slurm.

One concern per module:

* :mod:`~guardctl.controller.lease`: only one controller acts at a time (a leader lease);
* :mod:`~guardctl.controller.classify`: what kind of finding each suspect is (transient,
  persistent node fault, structural, deterministic heterogeneity, fabric);
* :mod:`~guardctl.controller.requeue`: the ski-rental rule for requeueing a job off a slow node;
* :mod:`~guardctl.controller.rebalance`: rung a, whether a rebalanced job's step time recovers;
* :mod:`~guardctl.controller.sweeps`: the daemon's sweeps in flight, polled pass by pass;
* :mod:`~guardctl.controller.ladder`: each node's place on the ladder, read from the action log;
* :mod:`~guardctl.controller.policy`: the decisions, a pure function of (analysis, jobs, ladder);
* :mod:`~guardctl.controller.record`: decisions and their evidence in the action log;
* :mod:`~guardctl.controller.fabric`: the fabric findings open in the log, for every surface;
* :mod:`~guardctl.controller.loop`: one pass (read, decide, act, record) and the daemon.

The controller acts only through the node-action door (:class:`guardctl.nodeops.NodeOps`) and
the sweep (:mod:`guardctl.sweep.engine`), so ownership, caps, the rate limit and the
intent-before/outcome-after log hold for it as for every other command.
"""
