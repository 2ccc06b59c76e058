"""The conformance suite runs every test on every backend: memory and ZooKeeper on asyncio
and trio, etcd on asyncio only (coord's HTTP/2 transport is asyncio code)."""

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
def anyio_backend(
    store: tuple[str, str], request: pytest.FixtureRequest
) -> str | tuple[str, dict[str, object]]:
    """The event loop of *store*. The memory store on trio runs on trio's MockClock,
    flowing at real speed and jumping ahead whenever every task waits: its leases, TTLs
    and timeouts all read the loop's clock, so a test that waits out a TTL takes no real
    time there (anyio's own TTL tests use MockClock too). Tests marked ``real_clock``
    measure what coord reads from ``time.time()``/``time.monotonic()`` and keep the real
    clock."""
    if store == ("memory", "trio") and request.node.get_closest_marker("real_clock") is None:
        from trio.testing import MockClock

        return "trio", {"clock": MockClock(rate=1.0, autojump_threshold=0)}
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


@pytest.fixture(params=["strict", "cohort"])
def mutex_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a mutex test twice: as written (strict FIFO), and with every
    ``client.mutex(name)`` that does not choose a mode made in cohort mode
    (``local_handoff=2``), so that the whole conformance suite holds in both."""
    if request.param == "cohort":
        strict = coord.Client.mutex

        def mutex(
            self: coord.Client,
            name: str,
            *,
            reentrant: bool = False,
            local_handoff: int | None = None,
        ) -> coord.Mutex:
            return strict(self, name, reentrant=reentrant, local_handoff=local_handoff or 2)

        monkeypatch.setattr(coord.Client, "mutex", mutex)
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the cohort-mode run of a test marked ``strict_only`` (it tests what
    cohort mode changes on purpose: e.g. that service order is registration order
    across all tasks). Deselected, not skipped: there is nothing missing to report."""
    strict_only = [
        item
        for item in items
        if item.get_closest_marker("strict_only") is not None
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("mutex_mode") == "cohort"  # type: ignore[attr-defined]
    ]
    if strict_only:
        config.hook.pytest_deselected(items=strict_only)
        dropped = set(map(id, strict_only))
        items[:] = [item for item in items if id(item) not in dropped]
