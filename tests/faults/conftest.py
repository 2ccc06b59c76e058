"""Fixtures the fault-suite modules share: one store of each kind, of the test's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from coord.testing import EtcdServer, TcpProxy, ZooKeeperServer

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


@pytest.fixture
def server(kind: str) -> Iterator[EtcdServer | ZooKeeperServer]:
    """A server of this test's own: some scenarios kill it."""
    factory = EtcdServer if kind == "etcd" else ZooKeeperServer
    with factory() as server:
        yield server


@pytest.fixture
def proxy(server: EtcdServer | ZooKeeperServer) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the test's server, to cut a client off and heal."""
    port = server.client_port if isinstance(server, EtcdServer) else server.port
    with TcpProxy(port) as proxy:
        yield proxy
