"""``Election.run``'s defaults, on the memory store and trio's MockClock."""

from __future__ import annotations

import itertools

import anyio
import pytest
from trio.testing import MockClock

import coord
from coord.testing.pytest_plugin import fresh_namespace

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def test_a_leader_that_returns_at_once_campaigns_again_after_a_second() -> None:
    """By default run() waits a second before campaigning again, so a leader whose fn
    returns at once (nothing to do yet, a failed precondition) does not spin: no tight
    loop of writes to the store and of "leading" / "stopped leading" log lines."""
    starts: list[float] = []
    scope = anyio.CancelScope()

    async def lead(term: coord.Term) -> None:
        starts.append(anyio.current_time())
        if len(starts) == 4:
            scope.cancel()  # (only cancellation ends run)

    async with coord.connect(f"memory://{fresh_namespace()}") as client:
        with anyio.fail_after(60), scope:
            await client.election("e").run(lead, b"me")
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) == 3
    assert all(gap >= 1.0 for gap in gaps), gaps
