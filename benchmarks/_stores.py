"""The throwaway servers the benchmarks start: each store as production runs it (etcd's
default fsync; ZooKeeper with ``forceSync=yes`` on the JVM's defaults), never the quick
settings the tests use. One place, so that every benchmark measures the same stores."""

from __future__ import annotations

from coord.testing import EtcdServer, ZooKeeperServer


def production_server(store: str) -> EtcdServer | ZooKeeperServer:
    """A server of *store* (``"etcd"``, or ``"zk"`` for ZooKeeper), not yet started."""
    if store == "etcd":
        return EtcdServer()
    if store == "zk":
        return ZooKeeperServer(force_sync=True, jvm="production")
    raise ValueError(f"store must be 'etcd' or 'zk', not {store!r}")
