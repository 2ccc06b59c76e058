"""ZooKeeper-only tests: faults that need a real server (dropped connections, restarts,
SIGSTOP), protected-mode creates, the cost of a release, auth and ACLs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import coord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


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
