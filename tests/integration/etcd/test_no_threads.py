"""The etcd backend starts no thread since it speaks gRPC itself (``_http2.py``; grpc.aio
ran a poller thread and four ``event_engine`` threads): a client's life leaves
``threading.enumerate()`` as it was (endpoints given as addresses: a host name is
resolved by asyncio's executor, a thread of the event loop's)."""

from __future__ import annotations

import threading

import anyio
import pytest

import coord
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.etcd


async def test_a_clients_life_starts_no_thread(etcd_url: str) -> None:
    before = set(threading.enumerate())
    with anyio.fail_after(30):
        async with coord.connect(etcd_url, ttl=5) as a, coord.connect(etcd_url) as b:
            mutex = a.mutex("threads")
            hold = await mutex.acquire()
            async with anyio.create_task_group() as tg:

                async def wait_for_it() -> None:
                    async with b.mutex("threads") as second:
                        assert second.fence > hold.fence

                tg.start_soon(wait_for_it)
                await wait_for_waiters(a, "threads", 2)
                await mutex.release()
            async with a.election("threads").campaign(b"a"):
                leader = await b.election("threads").leader()
                assert leader is not None
                assert leader.value == b"a"
    assert set(threading.enumerate()) - before == set()
