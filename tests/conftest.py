from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from blockbuster import blockbuster_ctx

if TYPE_CHECKING:
    from collections.abc import Iterator

    from blockbuster import BlockBuster

# Unit tests run on both event loops (anyio's own conftest does the same).
# Trio without an explicit clock; TTL tests ask for trio's MockClock themselves.


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def blockbuster(request: pytest.FixtureRequest) -> Iterator[BlockBuster]:
    """Fail any test that makes a blocking call on the event loop."""
    yield from _watch_for_blocking_calls()
    if request.node.get_closest_marker("etcd") is not None:
        # gRPC objects caught in reference cycles are freed by the cyclic collector at
        # some later point, and a channel's __dealloc__ takes a lock: freed during a
        # later test, with coord's frames on the stack, it would trip that test's
        # blocking-call check. Free them here, where nothing is watched.
        gc.collect()


def _watch_for_blocking_calls() -> Iterator[BlockBuster]:
    with blockbuster_ctx("coord") as bb:
        # connect() checks that TLS files exist, at the call (one stat of a local file).
        bb.functions["os.stat"].can_block_in(
            "coord/backends/etcd/_connection.py", "_check_readable"
        )
        yield bb


@pytest.fixture
def guard_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holds arm their guard watch at once (GUARD_DELAY 0), as soon as they exist.

    For tests that count server messages over a window: with the default delay a guard
    armed by a waiter registered a second earlier could land in the window (on a slow
    machine), and the count would depend on timing."""
    import coord._hold

    monkeypatch.setattr(coord._hold, "GUARD_DELAY", 0.0)


#: What ``pytest -m "not slow"`` (the quick loop) leaves out, relative to tests/: the
#: multi-process fault suite, the installs of the packaging test, subprocess-driven CLI,
#: example and docs runs, type checkers, and the integration tests that wait out TTLs,
#: restarts and outages. The conformance suite (tests/contract) on every store stays in.
SLOW = (
    "faults/",
    "packaging/",
    "cli/",
    "test_docs.py",
    "test_examples.py",
    "test_types.py",
    "contract/test_burst.py",
    "integration/test_election_restart.py",
    "integration/etcd/test_cluster.py",
    "integration/etcd/test_faults.py",
    "integration/etcd/test_proxy_faults.py",
    "integration/etcd/test_security.py",
    "integration/zookeeper/test_faults.py",
    "integration/zookeeper/test_load.py",
    "integration/zookeeper/test_proxy_faults.py",
    "integration/kafka/test_zombie.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW` ``slow``, and put the fault suite's runs in one
    pytest-xdist group per store: under ``--dist loadgroup`` at most two fault runs (each
    several processes and a server of its own) share the machine at once, so that their
    recovery deadlines measure coord, not a crowded CPU."""
    tests = Path(__file__).parent
    for item in items:
        where = item.path.relative_to(tests).as_posix()
        if where.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if where.startswith("faults/"):
            callspec = getattr(item, "callspec", None)
            kind = callspec.params.get("kind") if callspec is not None else None
            item.add_marker(pytest.mark.xdist_group(f"faults-{kind or 'cluster'}"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core, at least 4 and at most 8 (or
    ``$PYTEST_XDIST_AUTO_NUM_WORKERS``). The suite mostly waits (TTLs, outages, servers
    answering), so it runs well above one worker per core: 4 on a 2-core machine."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given:
        return int(given)
    return min(8, max(4, 2 * (os.cpu_count() or 1)))
