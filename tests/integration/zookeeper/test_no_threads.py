"""The ZooKeeper backend starts no thread (issue 18, "ZooKeeper without threads"): a
whole client's life, on asyncio and trio (the directory's event loops), leaves
``threading.enumerate()`` as it was."""

from __future__ import annotations

import threading

import anyio
import pytest

import coord
from coord.testing import wait_for_waiters

pytestmark = pytest.mark.zookeeper


def _threads() -> set[threading.Thread]:
    # anyio's pytest plugin runs trio in guest mode, whose I/O waits run on threads of
    # trio's cache ("Trio thread N"): the runner's, not the client's.
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


async def test_a_clients_life_starts_no_thread(zookeeper_url: str) -> None:
    before = _threads()
    with anyio.fail_after(30):
        async with coord.connect(zookeeper_url, ttl=5) as a, coord.connect(zookeeper_url) as b:
            mutex = a.mutex("threads")
            hold = await mutex.acquire()
            async with anyio.create_task_group() as tg:

                async def wait_for_it() -> None:
                    async with b.mutex("threads") as second:
                        assert second.fence > hold.fence

                tg.start_soon(wait_for_it)
                await wait_for_waiters(a, "threads", 2)  # (entries, then a watch)
                await mutex.release()
            async with a.election("threads").campaign(b"a") as term:
                leader = await b.election("threads").leader()
                assert leader is not None
                assert leader.value == term.value == b"a"
            await a.queue("threads").put(b"job")
            async with b.queue("threads").claim() as job:
                assert job.payload == b"job"
    assert _threads() - before == set()
