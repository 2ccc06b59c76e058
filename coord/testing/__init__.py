"""Test support for coord and for the test suites of coord's users.

* :class:`EtcdServer` starts a real etcd (Debian's ``etcd-server``) on free loopback ports
  in a temporary directory, and can stop, restart, pause (SIGSTOP) and resume it;
  :class:`ZooKeeperServer` does the same for ZooKeeper (Debian's ``zookeeper``, on Java).
* :class:`TansuBroker` and :class:`NoidaBroker` start Kafka-protocol brokers (from PyPI
  wheels) on a free loopback port: without and with transactions.
* :class:`TcpProxy` sits between one client and a server and delays, drops, holds
  (a partition) or resets its traffic, or refuses connections.
* Fault hooks that work on every backend: :func:`expire_session` (the store ends a
  client's session now), :func:`drop_key` (another client deletes a key).
* :func:`wait_for_waiters`: wait, by watching, until a lock has a number of waiters.
* A pytest plugin (:mod:`coord.testing.pytest_plugin`, loaded automatically when coord is
  installed) with session-scoped server fixtures.
"""

from __future__ import annotations

from ._faults import (
    compact,
    drop_key,
    expire_session,
    server_wakeups,
    wait_for_no_waiters,
    wait_for_waiters,
)
from ._kafka import KafkaBroker, NoidaBroker, TansuBroker
from ._proxy import TcpProxy
from ._servers import EtcdCluster, EtcdServer, ServerNotFound, ServerTLS, free_port
from ._zookeeper import ZooKeeperEnsemble, ZooKeeperServer

__all__ = [
    "EtcdCluster",
    "EtcdServer",
    "KafkaBroker",
    "NoidaBroker",
    "ServerNotFound",
    "ServerTLS",
    "TansuBroker",
    "TcpProxy",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "compact",
    "drop_key",
    "expire_session",
    "free_port",
    "server_wakeups",
    "wait_for_no_waiters",
    "wait_for_waiters",
]
