"""The Curator layout on ZooKeeper, between coord clients: the nodes Curator's recipes
make (protected names, the id as a latch's data), FIFO, and what is refused. Against
real Curator (the Java peer of ``curator/CuratorPeer.java``): see
``test_curator_interop.py``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import anyio
import pytest
from kazoo import exceptions as kz

import coord
from coord.cli import _snapshot
from coord.testing import expire_session

from ._kazoo import wait_children, zk_path
from ._support import raw_client

if TYPE_CHECKING:
    from collections.abc import Callable

    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def connect(url: str) -> coord.Client:
    return coord.connect(url, ttl=5, layout="curator")


async def test_mutex_nodes_and_fifo(zookeeper_server: ZooKeeperServer, zookeeper_url: str) -> None:
    order: list[int] = []
    with anyio.fail_after(10):
        async with connect(zookeeper_url) as a, connect(zookeeper_url) as b:
            first = await a.mutex("m").acquire()
            assert re.fullmatch(r"m/_c_[0-9a-f-]{36}-lock-0000000000", first.key)
            async with raw_client(zookeeper_server.endpoint) as zk:
                _, stat = await zk.get_data(zk_path(zookeeper_url, first.key))
                assert first.fence == stat.czxid

            async def take(client: coord.Client, i: int) -> None:
                async with client.mutex("m"):
                    order.append(i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(take, b, 1)
                await wait_children(a, "m", 2)
                tg.start_soon(take, a, 2)
                await wait_children(a, "m", 3)
                assert [w.holding for w in await a.mutex("m").waiters()] == [True, False, False]
                await first._end()  # (the holding task's release, without its claim)
    assert order == [1, 2]


async def test_latch_leader_and_refusals(zookeeper_url: str) -> None:
    with anyio.fail_after(10):
        async with connect(zookeeper_url) as client:
            election = client.election("e")
            async with election.campaign(b"node-1") as term:
                assert re.fullmatch(r"e/_c_[0-9a-f-]{36}-latch-0000000000", term.key)
                leader = await election.leader()
                assert leader is not None
                assert (leader.value, leader.fence) == (b"node-1", term.fence)
            with pytest.raises(coord.ConfigurationError, match="no semaphore"):
                client.semaphore("s", 2, layout="kazoo")
            with pytest.raises(coord.ConfigurationError, match="cohort"):
                client.mutex("m", local_handoff=2)
            assert client.rwlock("rw").write.layout == "curator"
            assert client.semaphore("s", 2).layout == "curator"  # the client's default


async def children_until(client: coord.Client, node: str, check: Callable[[int], bool]) -> int:
    """Until the number of *node*'s children passes *check* (by watch); that number."""
    backend = client.backend
    while True:
        children = await backend.child_names(node + "/")
        if check(len(children.names)):
            return len(children.names)
        await backend.wait_keys_changed(node + "/", revision=children.revision)


async def test_semaphore_leases_limit_and_handover(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """InterProcessSemaphoreV2's nodes: leases under s/leases, the mutex under s/locks
    released once the lease holds; the limit honoured; a release lets the waiter in."""
    holds: dict[str, coord.Hold] = {}
    release = {k: anyio.Event() for k in ("a", "b", "c")}

    async def hold(client: coord.Client, key: str, got: anyio.Event) -> None:
        async with client.semaphore("s", 2) as lease:
            holds[key] = lease
            got.set()
            await release[key].wait()

    with anyio.fail_after(15):
        async with connect(zookeeper_url) as a, connect(zookeeper_url) as b:
            async with anyio.create_task_group() as tg:
                got = {k: anyio.Event() for k in ("a", "b", "c")}
                tg.start_soon(hold, a, "a", got["a"])
                tg.start_soon(hold, b, "b", got["b"])
                await got["a"].wait()
                await got["b"].wait()
                for lease in holds.values():
                    assert re.fullmatch(r"s/leases/_c_[0-9a-f-]{36}-lease-\d{10}", lease.key)
                async with raw_client(zookeeper_server.endpoint) as zk:
                    _, stat = await zk.get_data(zk_path(zookeeper_url, holds["a"].key))
                    assert holds["a"].fence == stat.czxid
                await children_until(a, "s/locks", lambda n: n == 0)
                tg.start_soon(hold, a, "c", got["c"])  # a third: waits, holding s/locks
                await children_until(a, "s/leases", lambda n: n == 3)
                await children_until(a, "s/locks", lambda n: n == 1)
                waiters = await a.semaphore("s", 2).waiters()
                assert [w.holding for w in waiters] == [True, True, False]
                shown = (await _snapshot.read(a, "", layout="curator")).objects
                assert [(o["name"], o["limit"]) for o in shown] == [("s", 2)]  # not s/locks
                assert [e["key"] for e in shown[0]["entries"]] == [w.key for w in waiters]
                assert not got["c"].is_set()
                release["b"].set()  # any lease that goes lets it in
                await got["c"].wait()
                assert holds["c"].fence > holds["b"].fence
                await children_until(a, "s/locks", lambda n: n == 0)
                release["a"].set()
                release["c"].set()
            await children_until(a, "s/leases", lambda n: n == 0)


async def test_semaphore_cancelled_waiters_leave_nothing(zookeeper_url: str) -> None:
    """A waiter cancelled on the leases (it holds s/locks) and one cancelled in the
    s/locks queue leave neither node; the holder keeps its lease."""
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as a, connect(zookeeper_url) as b:
            async with a.semaphore("c", 1) as lease:

                async def wait(scope: anyio.CancelScope) -> None:
                    with scope:
                        await b.semaphore("c", 1).acquire()
                    assert scope.cancelled_caught

                first, second = anyio.CancelScope(), anyio.CancelScope()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait, first)
                    await children_until(a, "c/leases", lambda n: n == 2)
                    tg.start_soon(wait, second)
                    await children_until(a, "c/locks", lambda n: n == 2)
                    second.cancel()
                    await children_until(a, "c/locks", lambda n: n == 1)
                    first.cancel()
                await children_until(a, "c/locks", lambda n: n == 0)
                await children_until(a, "c/leases", lambda n: n == 1)
                assert not lease.lost
                assert [w.key for w in await a.semaphore("c", 1).waiters()] == [lease.key]
            with pytest.raises(coord.LockedError):
                async with b.semaphore("c", 1), b.semaphore("c", 1):
                    pass  # (a task holds one lease of a name)
            async with a.semaphore("c", 1) as mine:
                with pytest.raises(coord.LockedError, match="taken"):
                    await b.semaphore("c", 1).try_acquire()
                await children_until(a, "c/leases", lambda n: n == 1)
                assert [w.key for w in await a.semaphore("c", 1).waiters()] == [mine.key]


async def test_semaphore_lost_session(zookeeper_url: str) -> None:
    """A session that expires: the holder's body is cancelled and LockLost raised; the
    waiter of the same client (on the leases, holding x/locks) starts over on the next
    session and gets the lease its old session's nodes held."""
    with anyio.fail_after(20):
        async with connect(zookeeper_url) as a:
            first = a.session
            got: list[coord.Hold] = []

            async def holder() -> None:
                with pytest.raises(coord.LockLost):
                    async with a.semaphore("x", 1):
                        await anyio.sleep_forever()

            async def waiter() -> None:
                async with a.semaphore("x", 1) as hold:
                    got.append(hold)

            async with anyio.create_task_group() as tg:
                tg.start_soon(holder)
                await children_until(a, "x/leases", lambda n: n == 1)
                tg.start_soon(waiter)
                await children_until(a, "x/leases", lambda n: n == 2)
                await expire_session(a)
            assert got[0].session is not first
            await children_until(a, "x/leases", lambda n: n == 0)
            await children_until(a, "x/locks", lambda n: n == 0)


async def test_release_whose_delete_reply_is_lost(zookeeper_url: str) -> None:
    """A release whose delete was applied but whose reply was lost with the connection
    is a release, not a loss: the next attempt finds the node gone because the first one
    deleted it (coord's own layout and etcd say the same after a repeat)."""
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as a:
            async with a.mutex("lost-reply") as hold:
                wire = a.backend._conn.client  # type: ignore[attr-defined]
                real = wire.delete
                calls: list[str] = []

                async def reply_lost(path: str, version: int = -1) -> None:
                    calls.append(path)
                    await real(path, version)
                    if len(calls) == 1:
                        raise kz.ConnectionLoss("the reply was lost")

                wire.delete = reply_lost
            assert calls
            assert hold.released
            assert not hold.lost
            await children_until(a, "lost-reply", lambda n: n == 0)
