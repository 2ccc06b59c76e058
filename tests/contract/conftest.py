"""The conformance suite runs every test on every backend, each on asyncio and trio: the
memory store, ZooKeeper, and etcd (on asyncio its transport takes asyncio's fast path,
on trio the generic anyio one)."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import pytest

import coord
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Generator, Iterator

STORES = [
    pytest.param(("memory", "asyncio"), id="memory-asyncio"),
    pytest.param(("memory", "trio"), id="memory-trio"),
    pytest.param(("etcd", "asyncio"), id="etcd", marks=pytest.mark.etcd),
    pytest.param(("etcd", "trio"), id="etcd-trio", marks=pytest.mark.etcd),
    pytest.param(("zookeeper", "asyncio"), id="zookeeper", marks=pytest.mark.zookeeper),
    pytest.param(("zookeeper", "trio"), id="zookeeper-trio", marks=pytest.mark.zookeeper),
]

#: The modules that run on etcd under trio. The whole suite on etcd-trio takes about 80 s
#: more on two cores, and the suite's budget is 8 minutes; and on trio the recipes and
#: the backend run the same code as on asyncio: what differs is the transport under them
#: (its pipe on anyio streams, its timers and events). These modules drive all of that:
#: every operation of the contract, the mutex (strict mode: cohort mode changes nothing
#: below the recipe), cancellation at every point, a backend closed under its callers,
#: guards (the watch stream), message limits (flow control both ways), fencing, put_many.
ETCD_TRIO_MODULES = frozenset(
    {
        "test_backend_contract",
        "test_mutex",
        "test_cancelling",
        "test_closed_under",
        "test_guard",
        "test_limits",
        "test_fencing",
        "test_waiters",
        "test_session_tasks",
        "test_put_many",
        "test_queue_fast_paths",
    }
)

#: ``COORD_TRIO_ALL=1``: every module on etcd-trio too (the whole suite there, run before
#: a change to the transport lands; ``-k etcd-trio`` runs just that).
ALL_ON_TRIO = os.environ.get("COORD_TRIO_ALL") == "1"

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
def mutex_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a mutex test twice: as written (strict FIFO), and with every
    ``client.mutex(name)`` that does not choose a mode made in cohort mode
    (``local_handoff=2``), so that the whole conformance suite holds in both.

    Cohort mode changes nothing but the mutexes made by ``Client.mutex``: a test that
    makes none is marked ``no_mutex`` and runs once (its cohort run is deselected, see
    :func:`_deselected`). Both claims are checked here, on every run: a test marked
    ``no_mutex`` that makes a mutex fails, and so does the cohort run of a test that
    makes none (it would repeat the strict run: mark it ``no_mutex``)."""
    strict = coord.Client.mutex
    made: list[str] = []
    if request.param == "cohort":

        def mutex(
            self: coord.Client,
            name: str,
            *,
            reentrant: bool = False,
            local_handoff: int | None = None,
        ) -> coord.Mutex:
            made.append(name)
            return strict(self, name, reentrant=reentrant, local_handoff=local_handoff or 2)

        monkeypatch.setattr(coord.Client, "mutex", mutex)
    else:

        def counted(self: coord.Client, *args: Any, **kwargs: Any) -> coord.Mutex:
            made.append(str(args[0] if args else kwargs.get("name")))
            return strict(self, *args, **kwargs)

        monkeypatch.setattr(coord.Client, "mutex", counted)
    yield str(request.param)
    if request.node.get_closest_marker("no_mutex") is not None:
        if made:
            pytest.fail(f"marked no_mutex, but made the mutexes {sorted(set(made))}")
    elif request.param == "cohort" and not made and request.node.stash.get(_PASSED, False):
        pytest.fail("made no mutex: this cohort run repeats the strict one (mark it no_mutex)")


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Whether the test's call passed (:func:`mutex_mode` checks a passed run only)."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the cohort-mode run of a test marked ``strict_only`` (it tests what
    cohort mode changes on purpose: e.g. that service order is registration order
    across all tasks) or ``no_mutex`` (it makes no mutex: its cohort run would repeat
    the strict one; :func:`mutex_mode` checks that), and the etcd-trio runs outside
    :data:`ETCD_TRIO_MODULES`.
    Deselected, not skipped: there is nothing missing to report."""
    deselected = [item for item in items if _deselected(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = set(map(id, deselected))
        items[:] = [item for item in items if id(item) not in dropped]


def _deselected(item: pytest.Item) -> bool:
    params = getattr(item, "callspec", None)
    if params is None:
        return False
    cohort = params.params.get("mutex_mode") == "cohort"
    if params.params.get("store") == ("etcd", "trio"):
        module = item.module.__name__.rpartition(".")[2]  # type: ignore[attr-defined]
        return cohort or (module not in ETCD_TRIO_MODULES and not ALL_ON_TRIO)
    return cohort and any(item.get_closest_marker(m) for m in ("strict_only", "no_mutex"))
