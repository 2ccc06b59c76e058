"""Fixtures the fault-suite modules share: one store of each kind, of the test's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, ZooKeeperServer

if TYPE_CHECKING:
    from collections.abc import Iterator

KINDS = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def _shared_servers() -> Iterator[dict[str, EtcdServer | ZooKeeperServer]]:
    """The servers of :func:`server` that tests share (one per kind), started when first
    needed, stopped at the end of the session."""
    servers: dict[str, EtcdServer | ZooKeeperServer] = {}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()


@pytest.fixture
def server(
    kind: str,
    request: pytest.FixtureRequest,
    _shared_servers: dict[str, EtcdServer | ZooKeeperServer],
) -> Iterator[EtcdServer | ZooKeeperServer]:
    """A server of this test's own if the test kills it (marked ``kills_server``);
    otherwise one that the fault tests of this process share (they run one after another,
    each in a namespace of its own: starting a server took 0.4 s on etcd, 0.7 s on
    ZooKeeper, per test). A shared server found stopped is replaced."""
    factory = EtcdServer if kind == "etcd" else ZooKeeperServer
    if request.node.get_closest_marker("kills_server") is not None:
        with factory() as own:
            yield own
        return
    shared = _shared_servers.get(kind)
    if shared is None or not shared.running:
        if shared is not None:
            shared.close()
        shared = _shared_servers[kind] = factory()
        shared.start()
    yield shared
