"""A burst of a thousand acquires at once, on memory, etcd and ZooKeeper.

On asyncio only: the trio runs take the same code path, and on ZooKeeper a burst costs
about 17 s (each registration reads the whole queue), which CI need not pay twice.
"""

from __future__ import annotations

import anyio
import pytest

import coord
from coord.testing import wait_for_waiters
from coord.testing._faults import _wait_for_queue as wait_for_queue

from .conftest import STORES

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[p for p in STORES if p.id != "memory-trio"])  # (MockClock)
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.mark.timeout(120)  # ~17 s on ZooKeeper: each registration lists the queue
async def test_a_burst_of_waiters_fails_nothing_and_leaves_nothing(coord_url: str) -> None:
    """A thousand acquires registering at once, with a TTL shorter than the burst takes
    to register (each ZooKeeper registration reads the whole queue). Registering used to
    be bounded by the TTL: the late ones failed with BackendUnavailable and left their
    keys behind, bound to a live lease, and nobody could acquire again. Now none fails,
    no session is lost, and once they are all cancelled no key is left."""
    waiters = 1000
    async with coord.connect(coord_url, ttl=5) as a, coord.connect(coord_url, ttl=5) as b:
        holder = a.mutex("burst")
        await holder.acquire()
        errors: list[BaseException] = []
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                try:
                    await b.mutex("burst").acquire()
                except Exception as exc:
                    errors.append(exc)

            for _ in range(waiters):
                tg.start_soon(waiter)
            with anyio.fail_after(60):
                await wait_for_waiters(a, "burst", waiters + 1)
            tg.cancel_scope.cancel()
        assert errors == []
        with anyio.fail_after(30):
            await wait_for_queue(a, "burst", lambda n: n == 1)
        await holder.release()
        assert a.statistics().sessions_lost == b.statistics().sessions_lost == 0
        async with coord.connect(coord_url, ttl=5) as c:
            with anyio.fail_after(5):
                async with c.mutex("burst"):
                    pass
