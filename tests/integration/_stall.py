"""A holder whose event loop is blocked (a long synchronous call, a GC pause): while the
network to the store is cut for longer than its TTL, the store expires its session and
hands the lock on, and the body, when the loop runs again, ends with no further
checkpoint; for less than what its session allows, the hold survives. Shared by the etcd
and ZooKeeper suites."""

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


async def holder_stalled_within_its_ttl(url: str) -> None:
    """The loop blocked for 0.6 TTL, twice, each 0.5 s after the last answer: more than
    the 2/3 of the timeout a ZooKeeper connection may go unanswered, counted from that
    answer; less than what the store's session allows (the keepalives went out when the
    loop last ran). The hold survives and the session is the same: a stall of the
    client's own is not the server's silence (the connection used to be dropped on
    waking, which voids every hold)."""
    ttl = 3.0
    async with coord.connect(url, ttl=ttl) as holder:
        async with holder.mutex("stalled") as hold:
            session = hold.session
            # A first stall past a third of the TTL: every keepalive is due on waking,
            # so the next stall begins with the session just renewed.
            time.sleep(ttl / 3 + 0.2)  # noqa: ASYNC251  (a stall)
            for _ in range(2):
                await anyio.sleep(0.5)  # (the keepalives are answered)
                time.sleep(0.6 * ttl)  # noqa: ASYNC251  (the stall under test)
            await anyio.sleep(0.5)
            assert not hold.lost
        # (released without LockLost: the hold was never void, nor interrupted)
        assert hold.session is session
        assert holder.statistics().sessions_lost == 0
