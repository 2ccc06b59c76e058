"""ZooKeeper-only tests: faults that need a real server (dropped connections, restarts,
SIGSTOP), protected-mode creates, the cost of a release, auth and ACLs, TLS."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import coord
from coord.testing import ServerTLS, ZooKeeperServer

# The Curator peer's fixtures (curator/CuratorPeer.java), registered for these tests.
from ._curator import curator_classpath, curator_peers  # noqa: F401

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # the backend starts no thread: any event loop will do


@pytest.fixture
async def tolerant(zookeeper_url: str) -> AsyncIterator[coord.Client]:
    """A client that survives a short disconnection (``suspended_is_lost=False``)."""
    async with coord.connect(zookeeper_url, ttl=5, suspended_is_lost=False) as client:
        yield client


@pytest.fixture
async def other(zookeeper_url: str) -> AsyncIterator[coord.Client]:
    """A second client (another session) on the same chroot, default policy."""
    async with coord.connect(zookeeper_url, ttl=5) as client:
        yield client


@pytest.fixture(scope="session")
def tls_zookeeper(
    certs: dict[str, str], zookeeper_server: ZooKeeperServer
) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper serving TLS on its ``secure_port`` (client certificates required) as
    well as plain text on its ``port``."""
    del zookeeper_server  # only for the skip/fail policy when ZooKeeper is not installed
    tls = ServerTLS(certs["ca.pem"], certs["server.pem"], certs["server.key"], True)
    with ZooKeeperServer(tls=tls) as server:
        yield server
