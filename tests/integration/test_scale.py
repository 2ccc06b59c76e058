"""Ten thousand waiters on one mutex, on each store (issue 18).

etcd: registration used to read the queue sorted by creation revision, which etcd answers
by reading every key of it, inside the apply loop: 5,000 waiters on one mutex made the
server time out requests ("waiting for the applied index took too long"), every session
of the client was lost and the gate holder got LockLost. Now a waiter's key carries its
order number (backends/etcd/_waitqueue.py): registration writes a batch and reads at most
one key, a handoff reads the key right ahead and the queue's first key.

ZooKeeper: every registration and every handoff listed the queue's node, all of its
children (3,000 waiters failed). Now a waiter that finds a long queue moves its node into
a shard of the queue (backends/zookeeper/_waitqueue.py): a listing reads the head's nodes,
the shards' names and one shard.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest
from anyio.streams.text import TextReceiveStream

import coord
from coord.testing import EtcdServer, ZooKeeperServer, wait_for_waiters

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: Another process's client on a 2 s lease, there for the whole burst: what the store's
#: other tenants see (a bystander in this process would measure this event loop, which
#: ten thousand waiters keep busy, not the store).
BYSTANDER = """
import sys, anyio, coord
async def main(url):
    async with coord.connect(url, ttl=2) as client:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)
        print("sessions lost", client.statistics().sessions_lost, flush=True)
anyio.run(main, sys.argv[1])
"""
WAITERS = int(os.environ.get("COORD_TEST_WAITERS", "10000"))
CLIENTS = 8


@pytest.fixture(params=["etcd", "zookeeper"])
def server(request: pytest.FixtureRequest) -> Iterator[EtcdServer | ZooKeeperServer]:
    """A server of this test's own (an etcd's log tells whether it timed requests out)."""
    with EtcdServer() if request.param == "etcd" else ZooKeeperServer() as server:
        yield server


@pytest.mark.timeout(900)
async def test_ten_thousand_waiters_register_and_drain_in_fifo_order(
    server: EtcdServer | ZooKeeperServer,
) -> None:
    """Every waiter acquires once, in queue order; a bystander's 2 s session is never
    lost; the server times nothing out; nothing is left in the store."""
    url = server.url + "/scale"
    async with AsyncExitStack() as stack:
        process = await stack.enter_async_context(
            await anyio.open_process([sys.executable, "-c", BYSTANDER, url + "/bystander"])
        )
        assert process.stdout is not None
        assert process.stdin is not None
        output = TextReceiveStream(process.stdout)
        with anyio.fail_after(30):
            assert "ready" in await output.receive()
        # Counts the queue: its listings read ten thousand entries on a loop that ten
        # thousand waiters keep busy, each batch within its session timeout.
        bystander = await stack.enter_async_context(coord.connect(url, ttl=30))
        clients = [
            await stack.enter_async_context(coord.connect(url, ttl=10)) for _ in range(CLIENTS)
        ]
        gate = clients[0].mutex("m")
        await gate.acquire()
        fences: list[int] = []
        errors: list[BaseException] = []

        async def waiter(i: int) -> None:
            try:
                async with clients[i % CLIENTS].mutex("m") as hold:
                    fences.append(hold.fence)
            except Exception as exc:
                errors.append(exc)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(WAITERS):
                tg.start_soon(waiter, i)
                if i % 500 == 499:
                    # A burst as fast as the client can register, in steps that leave
                    # the loop its turns: ten thousand first steps in one turn block it
                    # for 8 s on a loaded 2-core machine, more than a ZooKeeper session
                    # may go without a ping (the burst measures the store, not that).
                    await anyio.lowlevel.checkpoint()
            with anyio.fail_after(600):
                await wait_for_waiters(bystander, "m", WAITERS + 1)
            registered = time.monotonic()
            await gate.release()
        drained = time.monotonic()
        print(
            f"{WAITERS} waiters: registered in {registered - started:.1f} s, "
            f"drained in {drained - registered:.1f} s"
        )
        assert errors == []
        assert len(fences) == WAITERS
        assert all(a < b for a, b in itertools.pairwise(fences)), "not FIFO"
        for client in [bystander, *clients]:
            assert client.statistics().sessions_lost == 0
        assert (await bystander.backend.entries("m/")).entries == ()
        assert await bystander.backend.names() == []
        if isinstance(server, EtcdServer):  # at most an idle tail, bound to a session
            tail = await bystander.backend.get("m/@")
            assert tail is None or (tail.value.endswith(b".") and tail.lease), tail
        await process.stdin.aclose()
        with anyio.fail_after(30):
            said = "".join([chunk async for chunk in output])
        assert "sessions lost 0" in said, said
    if not isinstance(server, EtcdServer):
        return
    async with coord.connect(url, ttl=10) as after:
        assert await after.backend.get("m/@") is None, "the queue's tail outlived the sessions"
    with open(server.log_path, errors="replace") as log:  # noqa: ASYNC230 (a local file)
        text = log.read()
    assert "request timed out" not in text
    assert "waiting for the applied index" not in text
