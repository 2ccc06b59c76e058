"""The conformance suite runs every test on every backend: memory and ZooKeeper on asyncio
and trio, etcd on asyncio only (aetcd's gRPC is asyncio code)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import pytest

import coord
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

STORES = [
    pytest.param(("memory", "asyncio"), id="memory-asyncio"),
    pytest.param(("memory", "trio"), id="memory-trio"),
    pytest.param(("etcd", "asyncio"), id="etcd", marks=pytest.mark.etcd),
    pytest.param(("zookeeper", "asyncio"), id="zookeeper", marks=pytest.mark.zookeeper),
    pytest.param(("zookeeper", "trio"), id="zookeeper-trio", marks=pytest.mark.zookeeper),
]

#: The stores that run on asyncio (for tests of asyncio's own cancellation, or too slow
#: to run twice over the same code path).
ASYNCIO_STORES = [p for p in STORES if p.values[0][1] == "asyncio"]  # type: ignore[index]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def anyio_backend(store: tuple[str, str]) -> str:
    return store[1]


@pytest.fixture
def coord_url(store: tuple[str, str], request: pytest.FixtureRequest) -> str:
    kind = store[0]
    if kind == "memory":
        return f"memory://{fresh_namespace()}"
    return str(request.getfixturevalue(f"{kind}_url"))


@pytest.fixture
async def clients(coord_url: str) -> AsyncIterator[list[coord.Client]]:
    """Four clients (four sessions) on this test's store, closed at the end of the test.

    Opened here rather than by the test: a context entered in the test body could not be
    exited in the fixture's teardown (anyio cancel scopes nest per task)."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(coord.connect(coord_url, ttl=5.0)) for _ in range(4)]
