"""The node-action door: every change guardctl makes to a node goes through :class:`NodeOps`.

Split by concern:

* :mod:`~guardctl.nodeops.ownership`: who holds a node (guardctl's record beside Slurm's state);
* :mod:`~guardctl.nodeops.rules`: the safety rules checked before anything reaches Slurm
  (ownership refusals, caps, rate limit);
* :mod:`~guardctl.nodeops.actions`: drain, resume, quarantine, release (and the controller's
  requeue of a job off a node), each logged as an intent before and an outcome after;
* :mod:`~guardctl.nodeops.reconcile`: closing the intents a crash or a Slurm timeout left open,
  deleting the reservations nothing else will give back (and releasing a job a requeue left
  held);
* :mod:`~guardctl.nodeops.checkpoint`: what a checkpoint of the action log keeps.

"The controller" in guardctl means the mitigation loop (:mod:`guardctl.controller`), which acts
through this door like every other command; slurmctld is "the Slurm controller".
"""

from guardctl.nodeops.actions import Action, NodeOps
from guardctl.nodeops.ownership import NodeStatus, Owner, Snapshot

__all__ = ["Action", "NodeOps", "NodeStatus", "Owner", "Snapshot"]
