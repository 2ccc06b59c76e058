"""The Curator layout against real Apache Curator: coord's ``layout="curator"`` and the
Java peer of ``curator/CuratorPeer.java`` (Debian's Curator 5.4, driven by
``_curator.py``) on one lock, read-write lock or election of the suite's ZooKeeper, in
both directions: exclusion, FIFO across the two, leadership, a holder SIGKILLed on
either side, a cancelled coord waiter, a revocation write into coord's node. The chroot
of ``zookeeper_url`` is the peer's namespace, so coord's ``m`` is the peer's ``/m``.
No sleep synchronizes: each step waits for the peer's line or for the children of the
lock's node (by watch); a grant that must not happen is watched for a bounded time.

Read against apache/curator ``curator-recipes/.../locks/LockInternals.java``,
``StandardLockInternalsDriver.java``, ``InterProcessReadWriteLock.java``,
``Revoker.java``, ``leader/LeaderLatch.java`` and ``leader/LeaderSelector.java``."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord

from .._peer import Peer
from ._kazoo import wait_children, zk_path
from ._support import backend_of, raw_client

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from coord.testing import ZooKeeperServer

    from ._curator import CuratorPeer, CuratorPeers

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]

WAIT = 0.7  # how long a blocked contender is watched for a grant it must not get
SESSION = 4.0  # the peer's session timeout, s
TTL = 3.0  # coord's


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the peer is another process: one event loop is enough


def connect(url: str, ttl: float = TTL) -> coord.Client:
    return coord.connect(url, ttl=ttl, layout="curator")


class Holder:
    """A coord lock (or campaign) taken in a task of its own: :attr:`granted` once it
    holds, held until :meth:`let_go`."""

    def __init__(self, lock: AbstractAsyncContextManager[coord.Hold]) -> None:
        self.lock = lock
        self.granted = anyio.Event()
        self.hold: coord.Hold | None = None
        self._go = anyio.Event()
        self.done = anyio.Event()

    async def run(self) -> None:
        try:
            async with self.lock as hold:
                self.hold = hold
                self.granted.set()
                await self._go.wait()
        finally:
            self.done.set()

    async def let_go(self) -> None:
        self._go.set()
        await self.done.wait()

    async def not_granted(self, within: float = WAIT) -> None:
        with anyio.move_on_after(within):
            await self.granted.wait()
        assert not self.granted.is_set(), "coord was granted what Curator holds"


async def children_until(client: coord.Client, name: str, count: int) -> list[str]:
    """Until the node *name* has exactly *count* children (by watch); their names."""
    backend = client.backend
    while True:
        children = await backend.child_names(name + "/")
        if len(children.names) == count:
            return list(children.names)
        await backend.wait_keys_changed(name + "/", revision=children.revision)


def node_of(line: str) -> str:
    """The node name at the end of a peer's ``locked <path> <node>`` line."""
    node = line.split()[2]
    assert re.fullmatch(r"_c_[0-9a-f-]{36}-lock-\d{10}", node), line
    return node


def sequence(node: str) -> int:
    return int(node[-10:])


async def test_mutex_excludes_both_ways(
    curator_peers: CuratorPeers, zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Curator holds: coord's try_acquire is refused (and leaves no node), its acquire
    waits, queued behind Curator's node, until Curator unlocks; then coord holds and
    Curator waits, until coord releases. (A nested name: both make the parents.)"""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            await java.send("lock /orders/m")
            theirs = node_of(await java.expect("locked /orders/m"))
            with pytest.raises(coord.LockedError):
                await client.mutex("orders/m").try_acquire()
            assert (await client.backend.child_names("orders/m/")).names == (theirs,)
            first = Holder(client.mutex("orders/m"))
            tg.start_soon(first.run)
            await wait_children(client, "orders/m", 2)
            await first.not_granted()
            waiters = await client.mutex("orders/m").waiters()
            assert [w.holding for w in waiters] == [True, False]
            assert waiters[0].key == f"orders/m/{theirs}"
            await java.send("unlock /orders/m")
            await java.expect("unlocked /orders/m")
            with anyio.fail_after(5):
                await first.granted.wait()
            assert first.hold is not None
            ours = first.hold.key.rpartition("/")[2]
            assert re.fullmatch(r"_c_[0-9a-f-]{36}-lock-\d{10}", ours)
            assert sequence(ours) > sequence(theirs)
            async with raw_client(zookeeper_server.endpoint) as zk:
                _, stat = await zk.get_data(zk_path(zookeeper_url, first.hold.key))
            assert first.hold.fence == stat.czxid

            await java.send("lock /orders/m")  # coord holds: Curator waits
            await wait_children(client, "orders/m", 2)
            await java.expect_none("locked /orders/m", within=WAIT)
            await first.let_go()
            second = node_of(await java.expect("locked /orders/m"))
            assert sequence(second) > sequence(ours)
            assert (await client.backend.child_names("orders/m/")).names == (second,)
            await java.send("unlock /orders/m")
            await java.expect("unlocked /orders/m")


async def test_fifo_coord_curator_coord(curator_peers: CuratorPeers, zookeeper_url: str) -> None:
    """coord holds, Curator queues, a second coord client queues: served in that order."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with (
            connect(zookeeper_url) as c0,
            connect(zookeeper_url) as c1,
            anyio.create_task_group() as tg,
        ):
            first, second = Holder(c0.mutex("q")), Holder(c1.mutex("q"))
            tg.start_soon(first.run)
            await first.granted.wait()
            await java.send("lock /q")
            await wait_children(c0, "q", 2)
            tg.start_soon(second.run)
            await wait_children(c0, "q", 3)
            await java.expect_none("locked /q", within=0.2)
            await first.let_go()
            await java.expect("locked /q")
            await second.not_granted()  # Curator came first
            await java.send("unlock /q")
            await java.expect("unlocked /q")
            with anyio.fail_after(5):
                await second.granted.wait()
            await second.let_go()


async def test_fifo_curator_coord_curator(curator_peers: CuratorPeers, zookeeper_url: str) -> None:
    """Curator holds, coord queues, a second Curator peer queues: served in that order
    (the second peer watches coord's node, and waits for coord's release)."""
    with anyio.fail_after(18):
        a = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        b = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            await a.send("lock /q")
            await a.expect("locked /q")
            middle = Holder(client.mutex("q"))
            tg.start_soon(middle.run)
            await wait_children(client, "q", 2)
            await b.send("lock /q")
            await wait_children(client, "q", 3)
            await a.send("unlock /q")
            await a.expect("unlocked /q")
            with anyio.fail_after(5):
                await middle.granted.wait()
            await b.expect_none("locked /q", within=WAIT)  # coord came first
            await middle.let_go()
            await b.expect("locked /q")


async def test_rwlock_across_coord_and_curator(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    """A Curator writer blocks coord's reader and writer; coord's writer blocks a Curator
    reader; readers of both share."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            rw = client.rwlock("rw")
            await java.send("write /rw")
            await java.expect("write-locked /rw")
            reader, writer = Holder(rw.read), Holder(rw.write)
            tg.start_soon(reader.run)
            await wait_children(client, "rw", 2)
            tg.start_soon(writer.run)
            names = await wait_children(client, "rw", 3)
            assert sum("__READ__" in n for n in names) == 1
            assert sum("__WRIT__" in n for n in names) == 2
            await reader.not_granted()
            await writer.not_granted(0)
            await java.send("unwrite /rw")
            await java.expect("write-unlocked /rw")
            with anyio.fail_after(5):
                await reader.granted.wait()
            await writer.not_granted()  # behind coord's reader now
            await reader.let_go()
            with anyio.fail_after(5):
                await writer.granted.wait()

            await java.send("read /rw")  # coord writes: Curator's reader waits
            await wait_children(client, "rw", 2)
            await java.expect_none("read-locked /rw", within=WAIT)
            await writer.let_go()
            await java.expect("read-locked /rw")

            shared = Holder(rw.read)  # Curator reads: coord's reader shares
            tg.start_soon(shared.run)
            with anyio.fail_after(5):
                await shared.granted.wait()
            late = Holder(rw.write)  # and coord's writer waits for both
            tg.start_soon(late.run)
            await wait_children(client, "rw", 3)
            await java.send("unread /rw")
            await java.expect("read-unlocked /rw")
            await late.not_granted()
            await shared.let_go()
            with anyio.fail_after(5):
                await late.granted.wait()
            await late.let_go()

            again = Holder(rw.read)  # coord reads: a Curator reader shares
            tg.start_soon(again.run)
            with anyio.fail_after(5):
                await again.granted.wait()
            await java.send("read /rw")
            await java.expect("read-locked /rw")
            await java.send("unread /rw")
            await java.expect("read-unlocked /rw")

            await java.send("write /rw")  # a Curator writer queues behind coord's reader,
            await wait_children(client, "rw", 2)
            barger = Holder(rw.read)  # and a later coord reader waits for that writer
            tg.start_soon(barger.run)
            await wait_children(client, "rw", 3)
            await barger.not_granted()
            await again.let_go()
            await java.expect("write-locked /rw")
            await barger.not_granted()
            await java.send("unwrite /rw")
            await java.expect("write-unlocked /rw")
            with anyio.fail_after(5):
                await barger.granted.wait()
            await barger.let_go()


async def leader_of(java: CuratorPeer, path: str, kind: str = "latch") -> str:
    await java.send(f"leader-of {path} {kind}")
    return (await java.expect(f"leader-of {path}")).split(" ", 2)[2]


class Observer:
    """coord's ``observe()`` of an election, in a task: the leaders' values it yields."""

    def __init__(self, election: coord.Election) -> None:
        self.election = election
        self.seen: list[bytes | None] = []
        self._changed = anyio.Event()

    async def run(self) -> None:
        async for leader in self.election.observe():
            self.seen.append(None if leader is None else leader.value)
            self._changed.set()
            self._changed = anyio.Event()

    async def until(self, value: bytes | None) -> None:
        """Until the last leader yielded has *value*."""
        with anyio.fail_after(5):
            while self.seen[-1:] != [value]:
                await self._changed.wait()


async def test_latch_leadership_moves_both_ways(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    """A LeaderLatch leads: it is coord's leader() (its id as the value) and coord's
    candidate waits; on unlatch coord leads, and getLeader() says so (and reads what
    coord proclaims); a new latch waits for coord to resign. observe() follows it all."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            election = client.election("e")
            assert await election.leader() is None
            assert await leader_of(java, "/e") == "NONE"
            observer = Observer(election)
            tg.start_soon(observer.run)
            await observer.until(None)
            await java.send("latch /e java-1")
            await java.expect("leader /e java-1")
            await observer.until(b"java-1")
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"java-1"
            assert re.fullmatch(r"e/_c_[0-9a-f-]{36}-latch-\d{10}", leader.key)

            candidate = Holder(election.campaign(b"coord-1"))
            tg.start_soon(candidate.run)
            await wait_children(client, "e", 2)
            await candidate.not_granted()
            assert await leader_of(java, "/e") == "java-1"
            await java.send("unlatch /e")
            await java.expect("unlatched /e")
            with anyio.fail_after(5):
                await candidate.granted.wait()
            assert await leader_of(java, "/e") == "coord-1"
            leader = await election.leader()
            assert leader is not None
            assert candidate.hold is not None
            assert (leader.key, leader.value) == (candidate.hold.key, b"coord-1")
            assert isinstance(candidate.hold, coord.Term)
            await observer.until(b"coord-1")
            await candidate.hold.proclaim(b"coord-2")  # Curator reads the node's data
            assert await leader_of(java, "/e") == "coord-2"
            await observer.until(b"coord-2")

            await java.send("latch /e java-2")
            await wait_children(client, "e", 2)
            await java.expect_none("leader /e", within=WAIT)
            await candidate.let_go()  # resigns
            await java.expect("leader /e java-2")
            await observer.until(b"java-2")
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"java-2"
            await java.send("unlatch /e")
            await java.expect("unlatched /e")
            await observer.until(None)
            assert observer.seen == [None, b"java-1", b"coord-1", b"coord-2", b"java-2", None]
            tg.cancel_scope.cancel()


async def test_selector_is_the_mutex(curator_peers: CuratorPeers, zookeeper_url: str) -> None:
    """A LeaderSelector is an InterProcessMutex whose node holds the id: coord's mutex on
    its path waits for it, and it waits for coord's mutex."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            await java.send("selector /s java-1")
            await java.expect("selected /s java-1")
            mutex = Holder(client.mutex("s"))
            tg.start_soon(mutex.run)
            await wait_children(client, "s", 2)
            await mutex.not_granted()
            await java.send("unselect /s")
            await java.expect("unselected /s")
            with anyio.fail_after(5):
                await mutex.granted.wait()
            who = await leader_of(java, "/s", "selector")
            assert '"pid"' in who  # Curator reads coord's node's data: its identity

            await java.send("selector /s java-2")
            await wait_children(client, "s", 2)
            await java.expect_none("selected /s", within=WAIT)
            await mutex.let_go()
            await java.expect("selected /s java-2")
            assert await leader_of(java, "/s", "selector") == "java-2"
            await java.send("unselect /s")
            await java.expect("unselected /s")


async def test_selector_leadership_moves_both_ways(
    curator_peers: CuratorPeers, zookeeper_url: str
) -> None:
    """``election(name, selector=True)`` takes part in a LeaderSelector's election: the
    selected Java peer is coord's ``leader()`` (its id as the value); coord's candidate
    waits, leads once the selector's term ends, and is then what
    ``LeaderSelector.getLeader()`` reports (the campaign value as the id); a new
    selector waits until coord resigns. A latch's ``leader()`` on the same name reads
    what Java's ``LeaderLatch.getLeader()`` reads there."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            election = client.election("sel", selector=True)
            await java.send("selector /sel java-1")
            await java.expect("selected /sel java-1")
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"java-1"
            # A latch's getLeader() reads every child of the path: as Java's does.
            latch = await client.election("sel").leader()
            assert latch is not None
            assert latch.value.decode() == await leader_of(java, "/sel", "latch") == "java-1"
            term = Holder(election.campaign(b"py-1"))
            tg.start_soon(term.run)
            await wait_children(client, "sel", 2)
            await term.not_granted()
            await java.send("unselect /sel")
            await java.expect("unselected /sel")
            with anyio.fail_after(5):
                await term.granted.wait()
            assert term.hold is not None
            assert re.fullmatch(r"sel/_c_[0-9a-f-]{36}-lock-\d{10}", term.hold.key)
            assert await leader_of(java, "/sel", "selector") == "py-1"
            leader = await election.leader()
            assert leader is not None
            assert (leader.value, leader.fence) == (b"py-1", term.hold.fence)

            await java.send("selector /sel java-2")
            await wait_children(client, "sel", 2)
            await java.expect_none("selected /sel", within=WAIT)
            await term.let_go()
            await java.expect("selected /sel java-2")
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"java-2"
            await java.send("unselect /sel")
            await java.expect("unselected /sel")


async def test_selector_is_curator_only(zookeeper_url: str) -> None:
    async with connect(zookeeper_url) as client:
        with pytest.raises(coord.ConfigurationError, match="layout='curator' only"):
            client.election("x", layout="kazoo", selector=True)
        with pytest.raises(TypeError):
            client.election("x", selector="yes")  # type: ignore[arg-type]
        assert "selector=True" in repr(client.election("x", selector=True))


#: The two recipes of the SIGKILL tests: (the peer's command to take it and its answer,
#: coord's side of it on the name ``k``).
KILLED = {
    "mutex": ("lock /k", "locked /k"),
    "election": ("latch /k java", "leader /k java"),
}


def coord_side(client: coord.Client, kind: str) -> AbstractAsyncContextManager[coord.Hold]:
    if kind == "mutex":
        return client.mutex("k")
    return client.election("k").campaign(b"coord")


@pytest.mark.parametrize("kind", list(KILLED))
async def test_killed_curator_holder_passes_to_coord(
    curator_peers: CuratorPeers, zookeeper_url: str, kind: str
) -> None:
    """A SIGKILLed Curator holder's node (or leading latch's) lives until its session
    times out; then coord's waiter holds (or leads)."""
    take, taken = KILLED[kind]
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, anyio.create_task_group() as tg:
            await java.send(take)
            await java.expect(taken)
            waiter = Holder(coord_side(client, kind))
            tg.start_soon(waiter.run)
            await wait_children(client, "k", 2)
            killed = anyio.current_time()
            java.kill()
            with anyio.fail_after(SESSION + 6):
                await waiter.granted.wait()
            waited = anyio.current_time() - killed
            assert waited > SESSION / 2, f"granted {waited:.2f} s after the kill"
            await waiter.let_go()


#: A coord holder in a process of its own (so that it can be SIGKILLed): connects with
#: ``layout="curator"`` and *ttl* to *url*, holds the mutex ``k`` (or leads the election
#: ``k``), prints ``held <key>``.
HOLDER = """
import sys, anyio, coord

async def main(url, ttl, kind):
    async with coord.connect(url, ttl=float(ttl), layout="curator") as client:
        if kind == "mutex":
            held = client.mutex("k")
        else:
            held = client.election("k").campaign(b"coord")
        async with held as hold:
            print("held", hold.key, flush=True)
            await anyio.sleep_forever()

anyio.run(main, *sys.argv[1:])
"""


@pytest.mark.parametrize("kind", list(KILLED))
async def test_killed_coord_holder_passes_to_curator(
    curator_peers: CuratorPeers, zookeeper_url: str, kind: str
) -> None:
    """A SIGKILLed coord holder's node (or leader's) lives until its session (the TTL)
    ends; then the Curator waiter locks (or its latch leads)."""
    take, taken = KILLED[kind]
    argv = [sys.executable, "-c", HOLDER, zookeeper_url, str(TTL), kind]
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with (
            connect(zookeeper_url) as client,
            await anyio.open_process(argv, stderr=None) as process,
        ):
            holder = Peer(process)
            key = (await holder.line()).split()[1]
            await java.send(take)
            names = await wait_children(client, "k", 2)
            assert key.rpartition("/")[2] in names
            await java.expect_none(taken, within=0.2)
            killed = anyio.current_time()
            holder.kill()
            await java.expect(taken, timeout=TTL + 6)
            waited = anyio.current_time() - killed
            assert waited > TTL / 2, f"Curator took it {waited:.2f} s after the kill"


async def test_cancelled_coord_waiter_leaves_no_node(
    curator_peers: CuratorPeers, zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Behind a Curator holder, with a second Curator waiter behind it: an anyio-cancelled
    and a natively cancelled coord waiter leave nothing (raw listing), and the second
    peer, which watched coord's node, still gets the lock after the first."""
    path = zk_path(zookeeper_url, "c")
    with anyio.fail_after(18):
        a = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        b = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, raw_client(zookeeper_server.endpoint) as zk:
            await a.send("lock /c")
            held = node_of(await a.expect("locked /c"))
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.mutex("c").acquire)
                    await wait_children(client, "c", 2)
                    await b.send("lock /c")  # it waits for coord's node
                    await wait_children(client, "c", 3)
                    scope.cancel()
            assert len(await children_until(client, "c", 2)) == 2
            assert held in await zk.get_children(path)

            task = asyncio.ensure_future(client.mutex("c").acquire())
            await wait_children(client, "c", 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await children_until(client, "c", 2)
            names = await zk.get_children(path)
            assert len(names) == 2
            assert held in names
            assert all("-lock-" in n and n.startswith("_c_") for n in names)

            await b.expect_none("locked /c", within=0.2)
            await a.send("unlock /c")
            await b.expect("locked /c")


async def test_release_after_a_revoke_write(
    curator_peers: CuratorPeers,
    zookeeper_server: ZooKeeperServer,
    zookeeper_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Curator's ``Revoker.attemptRevoke`` writes ``__REVOKE__`` into a holder's node
    (``locks/Revoker.java``): coord's holder ignores it, and a release whose delete
    meets that write (between its read of the node and its delete) still deletes the
    node, so that the Curator waiter behind it locks."""
    with anyio.fail_after(18):
        java = await curator_peers.start(zookeeper_url, session_timeout=SESSION)
        async with connect(zookeeper_url) as client, raw_client(zookeeper_server.endpoint) as zk:
            mutex = client.mutex("r")
            hold = await mutex.acquire()
            path = zk_path(zookeeper_url, hold.key)
            await java.send("lock /r")
            await wait_children(client, "r", 2)
            await zk.set_data(path, b"__REVOKE__")  # Revoker.attemptRevoke
            await java.expect_none("locked /r", within=0.2)
            assert not hold.lost

            conn = backend_of(client)._queues._conn
            call = conn.call

            async def revoked_first(what: str, request: Any, *, retry: bool = False) -> Any:
                if what == "delete":
                    monkeypatch.setattr(conn, "call", call)
                    await zk.set_data(path, b"__REVOKE__")  # again, just before the delete
                return await call(what, request, retry=retry)

            monkeypatch.setattr(conn, "call", revoked_first)
            await mutex.release()
            await java.expect("locked /r")
            assert len((await client.backend.child_names("r/")).names) == 1
