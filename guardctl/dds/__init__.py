"""Stateful dynamic data sharding (AntDT): a per-job service and its client.

``guardctl dds serve`` runs the service inside the job; training ranks use
:class:`Client`. See docs/dds.md.
"""

from __future__ import annotations

from guardctl.dds.client import (
    Batch,
    Client,
    NotAuthorised,
    RequestRejected,
    ServiceUnavailable,
    Shard,
)

__all__ = ["Batch", "Client", "NotAuthorised", "RequestRejected", "ServiceUnavailable", "Shard"]
