"""tooz (OpenStack's coordination library) as a benchmark peer, used as its docs say.

One tooz coordinator per benchmark client, started with its heartbeat thread
(``start(start_heart=True)``); locks from ``coordinator.get_lock(name)``, taken with
``acquire(blocking=True)`` and given back with ``release()``. tooz is synchronous: call
these from worker threads.
"""

from __future__ import annotations

import uuid
from typing import Any

import tooz.coordination

#: tooz's default namespace on ZooKeeper: a lock *name* is the znode /tooz/locks/<name>.
ZK_LOCKS = "/tooz/locks"


def tooz_url(zookeeper: bool, host: str, port: int) -> str:
    """tooz's URL of a store: etcd through its grpc-gateway (served on the client port)."""
    return f"zookeeper://{host}:{port}" if zookeeper else f"etcd3+http://{host}:{port}"


def coordinators(url: str, count: int) -> list[Any]:
    """*count* started tooz coordinators, each heartbeating in its own thread."""
    started: list[Any] = []
    try:
        for _ in range(count):
            member = f"bench-{uuid.uuid4().hex[:8]}".encode()
            coordinator = tooz.coordination.get_coordinator(url, member)
            coordinator.start(start_heart=True)
            started.append(coordinator)
    except BaseException:
        stop(started)
        raise
    return started


def stop(started: list[Any]) -> None:
    for coordinator in started:
        coordinator.stop()
