"""The ZooKeeper backend: coord's contract on ZooKeeper 3.5 or later, through kazoo.

Curator's lock recipe (``InterProcessMutex``), on kazoo's ``*_async`` calls bridged into
anyio (asyncio or trio):

* a lease is the ZooKeeper session; its timeout is the ttl. SUSPENDED counts as lost by
  default (Curator Tech Note 14); see :mod:`._lease`;
* a waiter entry is an EPHEMERAL_SEQUENTIAL node ``<root>/<name>/@<guid>-<seq>``: a GUID
  per acquire attempt (protected mode, CURATOR-498) and the sequence as queue order; its
  fencing token is the node's czxid; see :mod:`._queue`;
* a waiter watches only its predecessor, with a data watch, so a release wakes one
  waiter; watches are multiplexed per path (:mod:`._watches`);
* parents are container nodes, which the server removes when they empty;
* kazoo's threads never block the event loop and are never blocked by it
  (:mod:`._bridge`).
"""

from __future__ import annotations

from ._backend import ZooKeeperBackend
from ._lease import ZooKeeperLease

__all__ = ["ZooKeeperBackend", "ZooKeeperLease"]
