from __future__ import annotations

import gc
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
