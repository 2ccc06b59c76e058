"""Long queues on one mutex (past the length that shards them, and twice that), each
release costing O(1) server packets."""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

import coord
from coord.backends.zookeeper._waitqueue import SHARD_AFTER
from coord.backends.zookeeper._wire._connection import Connection
from coord.testing import ZooKeeperServer, wait_for_waiters

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]

HANDOFFS = 5
_SENT = re.compile(r"sent=(\d+),sid=")


@pytest.mark.usefixtures("guard_at_once")
async def test_long_queues_each_release_costs_the_same_packets(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Every packet the server sends to the clients (replies, watch events, pings) is
    counted; per handoff the count must not grow with the queue: a release wakes one
    waiter, which reads the queue once. A long ttl keeps kazoo's pings out of it."""
    costs = {}
    async with (
        coord.connect(zookeeper_url, ttl=30) as holders,
        coord.connect(zookeeper_url, ttl=30) as waiters,
    ):
        # Both queues are long enough to have shards (a handoff in one lists the
        # waiter's shard too: one reply more than in a short queue, whatever its length).
        short, long = SHARD_AFTER + 50, 2 * SHARD_AFTER + 100
        for queue in (short, long):
            costs[queue] = await _cost_per_handoff(zookeeper_server, holders, waiters, queue)
    assert costs[long] <= costs[short] + 1, f"packets per release grew with the queue: {costs}"
    assert costs[long] <= 8, costs  # delete reply, 1-2 watch events, two listings


async def _cost_per_handoff(
    server: ZooKeeperServer, holders: coord.Client, waiters: coord.Client, queue: int
) -> float:
    name = f"long{queue}"
    holder = holders.mutex(name)
    await holder.acquire()
    acquired: list[int] = []
    released = [anyio.Event() for _ in range(queue)]
    got_it = anyio.Event()

    async def waiter(i: int) -> None:
        nonlocal got_it
        async with waiters.mutex(name):
            acquired.append(i)
            got_it.set()
            await released[i].wait()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(queue):
                tg.start_soon(waiter, i)
            await wait_for_waiters(holders, name, queue + 1)
            before = await _quiet(server)  # every waiter has read the queue, armed its watch
            await holder.release()
            for handoff in range(HANDOFFS):
                await got_it.wait()
                got_it = anyio.Event()
                if handoff < HANDOFFS - 1:
                    released[acquired[-1]].set()
            after = await _quiet(server)  # the last holder's guard watch is armed
            cost = (after - before) / HANDOFFS
            assert len(acquired) == HANDOFFS
            tg.cancel_scope.cancel()
    return cost


async def _packets_sent(server: ZooKeeperServer) -> int:
    """The packets sent to client sessions so far: the sum of ``sent=`` over the
    connections listed by ``cons``. Like ``zk_packets_sent``, without the packets of the
    four-letter words themselves (their number depends on the length of the answer)."""
    text = await anyio.to_thread.run_sync(server.four_letter_word, "cons")
    return sum(int(sent) for sent in _SENT.findall(text))


async def _quiet(server: ZooKeeperServer) -> int:
    """The packet count once the server has sent nothing for 0.1 s (polled: what the
    clients still have in flight is not observable)."""
    last = await _packets_sent(server)
    while True:
        await anyio.sleep(0.1)
        count = await _packets_sent(server)
        if count == last:
            return count
        last = count


async def test_a_woken_waiter_lists_the_queue_once(
    zookeeper_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter woken by its predecessor's release reads its position with one listing
    of the queue's node: not also a listing of its shard on the off chance (a short queue
    has none; a wake-up cost 7 requests per contended acquisition instead of 6)."""
    sent: list[str] = []
    real = Connection.submit

    def counting(self: Connection, request: Any, arming: Any = None) -> Any:
        sent.append(type(request).__name__)
        return real(self, request, arming)

    async with coord.connect(zookeeper_url) as a, coord.connect(zookeeper_url) as b:
        first, second = a.mutex("once"), b.mutex("once")
        await first.acquire()
        got = anyio.Event()

        async def waiter() -> None:
            async with second:
                got.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await wait_for_waiters(a, "once", 2)
            monkeypatch.setattr(Connection, "submit", counting)
            await first.release()
            with anyio.fail_after(10):
                await got.wait()
            monkeypatch.undo()
    assert sent.count("GetChildren2") == 1, sent
