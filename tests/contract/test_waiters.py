"""Who holds and who waits: every waiter key carries its identity (host, pid, client
name), and ``waiters()`` / ``holders()`` read the queue in order, on every backend."""

from __future__ import annotations

import os
import socket
import time

import anyio
import pytest

import coord
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.anyio


async def test_mutex_waiters_in_order_with_identities(coord_url: str) -> None:
    async with (
        coord.connect(coord_url, ttl=5, identity="billing-1") as a,
        coord.connect(coord_url, ttl=5, identity="billing-2") as b,
    ):
        async with a.mutex("who") as hold, anyio.create_task_group() as tg:
            tg.start_soon(b.mutex("who").acquire)
            await wait_for_waiters(a, "who", 2)
            waiters = await b.mutex("who").waiters()
            assert [w.holding for w in waiters] == [True, False]
            assert waiters[0].fence == hold.fence
            assert waiters[0].key == hold.key
            assert waiters[0].identity == {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "name": "billing-1",
            }
            assert waiters[1].identity["name"] == "billing-2"
            # When each registered (this machine's clock): in queue order, not in the identity.
            assert waiters[0].since is not None
            assert waiters[1].since is not None
            # (recorded to the millisecond, rounded: up to 0.5 ms past the clock)
            assert waiters[0].since <= waiters[1].since <= time.time() + 0.001
            assert await a.mutex("who").holders() == waiters[:1]
            tg.cancel_scope.cancel()


async def test_semaphore_and_rwlock_holders(clients: list[coord.Client]) -> None:
    a, b, c, d = clients
    async with a.semaphore("sem-who", 2), b.semaphore("sem-who", 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.semaphore("sem-who", 2).acquire)
            await wait_for_waiters(a, "sem-who", 3)
            waiters = await d.semaphore("sem-who", 2).waiters()
            assert [w.holding for w in waiters] == [True, True, False]
            tg.cancel_scope.cancel()
    async with a.rwlock("rw-who").read, b.rwlock("rw-who").read:
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.rwlock("rw-who").write.acquire)
            await wait_for_waiters(a, "rw-who", 3)
            tg.start_soon(d.rwlock("rw-who").read.acquire)
            await wait_for_waiters(a, "rw-who", 4)
            waiters = await a.rwlock("rw-who").read.waiters()
            assert [w.holding for w in waiters] == [True, True, False, False]
            assert len(await a.rwlock("rw-who").write.holders()) == 2
            tg.cancel_scope.cancel()


async def test_bad_identity_is_refused_at_the_call(coord_url: str) -> None:
    for bad in ("", "x" * 200, "tab\there"):
        with pytest.raises(coord.ConfigurationError, match="identity"):
            coord.connect(coord_url, identity=bad)
    with pytest.raises(TypeError, match="identity"):
        coord.connect(coord_url, identity=42)  # type: ignore[arg-type]
