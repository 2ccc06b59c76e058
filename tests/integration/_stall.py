"""A holder whose event loop is blocked (a long synchronous call, a GC pause) while the
network to the store is cut for longer than its TTL: the store expires its session and
hands the lock on; then the loop runs again and the body ends with no further checkpoint.
Shared by the etcd and ZooKeeper suites."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

if TYPE_CHECKING:
    from coord.testing import TcpProxy


async def holder_stalled_past_its_ttl(proxied_url: str, direct_url: str, proxy: TcpProxy) -> None:
    ttl = 2.0
    async with (
        coord.connect(proxied_url, ttl=ttl) as holder,
        coord.connect(direct_url, ttl=ttl) as other,
    ):
        async with anyio.create_task_group() as tg:
            got = anyio.Event()

            async def next_holder() -> None:
                async with other.mutex("stalled"):
                    got.set()

            with pytest.raises(coord.LockLost):  # not a plain SessionExpiredError, not silence
                async with holder.mutex("stalled") as hold:
                    tg.start_soon(next_holder)
                    await anyio.sleep(0.5)  # the next holder queues
                    proxy.blackhole()
                    healer = threading.Timer(3 * ttl, proxy.heal)  # while the loop is stuck
                    healer.start()
                    time.sleep(3 * ttl + 1.5)  # noqa: ASYNC251  (the stall under test)
                    healer.join()
                    assert hold.lost  # read from the clock, no checkpoint needed
            with anyio.fail_after(10):
                await got.wait()
        with anyio.fail_after(10):  # and the holder's client carries on
            async with holder.mutex("stalled"):
                pass
