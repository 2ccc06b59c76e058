"""The ZooKeeper backend: coord's contract on ZooKeeper 3.5 or later, with no thread.

Curator's lock recipe (``InterProcessMutex``), on an anyio-native ZooKeeper client
(:mod:`._wire`, on kazoo's codec), on asyncio or trio:

* a lease is the ZooKeeper session; its timeout is the ttl. SUSPENDED counts as lost by
  default (Curator Tech Note 14); see :mod:`._lease`;
* a waiter entry is an EPHEMERAL_SEQUENTIAL node ``<root>/<name>/@<guid>-<seq>``: a GUID
  per acquire attempt (protected mode, CURATOR-498) and the sequence as queue order; its
  fencing token is the node's czxid; see :mod:`._waitqueue`;
* a waiter watches only its predecessor, with a data watch, so a release wakes one
  waiter; watches are multiplexed per path (:mod:`._watches`);
* parents are container nodes, which the server removes when they empty;
* one wire client per session (:mod:`._connection`): requests are awaited on the event
  loop, pipelined on one connection, and watch callbacks run in its reader task.
"""

from __future__ import annotations

from ._backend import ZooKeeperBackend
from ._lease import ZooKeeperLease

__all__ = ["ZooKeeperBackend", "ZooKeeperLease"]
