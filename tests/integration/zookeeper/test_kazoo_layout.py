"""The kazoo layout against real kazoo (python-zk/kazoo ``kazoo/recipe/lock.py``,
``election.py``): a kazoo service in a process of its own (``_kazoo_peer.py``), so that
it can be SIGKILLed, on the test's ZooKeeper."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import expire_session

from ._kazoo import kazoo_peer, wait_children, zk_path
from ._support import raw_client

if TYPE_CHECKING:
    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the peer is a process: one event loop is enough


def connect(url: str, ttl: float = 5) -> coord.Client:
    return coord.connect(url, ttl=ttl, layout="kazoo")


async def test_kazoo_holds_then_coord(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            line = await kz.ask(f"lock {zk_path(zookeeper_url, 'a')} kazoo-1")
            assert line.startswith("locked ")
            kazoo_node = line.split()[2]
            mutex = client.mutex("a")
            got: list[coord.Hold] = []
            granted = anyio.Event()

            async def take() -> None:
                async with mutex as hold:
                    got.append(hold)
                    granted.set()
                    await anyio.sleep_forever()

            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                await wait_children(client, "a", 2)
                await anyio.sleep(0.3)
                assert not got, "coord took a lock that kazoo holds"
                waiters = await mutex.waiters()
                assert [w.holding for w in waiters] == [True, False]
                assert waiters[0].key == f"a/{kazoo_node}"
                assert "__lock__" in waiters[1].key
                assert await kz.ask("unlock") == "unlocked"
                await granted.wait()
                entry = await client.backend.get(got[0].key)
                assert entry is not None
                assert got[0].fence == entry.revision  # the czxid
                contenders = await kz.ask(f"contenders {zk_path(zookeeper_url, 'a')}")
                assert '"pid"' in contenders  # kazoo reads coord's node's data: who
                tg.cancel_scope.cancel()
            assert (await client.backend.child_names("a/")).names == ()


async def test_coord_holds_then_kazoo_and_try(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    path = zk_path(zookeeper_url, "a")
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            mutex = client.mutex("a")
            async with mutex as hold:
                assert await kz.ask(f"try {path} k") == f"busy {path}"
                await kz.send(f"lock {path} kazoo-1")
                await wait_children(client, "a", 2)
                await anyio.sleep(0.3)  # kazoo would answer if it held
            line = await kz.line()
            assert line.startswith(f"locked {path} ")
            async with raw_client(zookeeper_server.endpoint) as zk:
                _, stat = await zk.get_data(f"{path}/{line.split()[2]}")
            assert stat.czxid > hold.fence
            with pytest.raises(coord.LockedError):
                await mutex.try_acquire()
            assert len((await client.backend.child_names("a/")).names) == 1


async def test_fifo_across_coord_and_kazoo(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """coord, kazoo, coord queued in that order are served in that order."""
    order: list[str] = []
    path = zk_path(zookeeper_url, "q")
    with anyio.fail_after(15):
        async with (
            connect(zookeeper_url) as c0,
            connect(zookeeper_url) as c1,
            kazoo_peer(zookeeper_server.endpoint) as kz,
        ):
            first = c0.mutex("q")
            await first.acquire()
            await kz.send(f"lock {path} kazoo")
            await wait_children(c0, "q", 2)

            async def second() -> None:
                async with c1.mutex("q"):
                    order.append("coord-2")

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                await wait_children(c0, "q", 3)
                await first.release()
                assert (await kz.line()).startswith("locked")
                order.append("kazoo")
                await anyio.sleep(0.3)
                assert order == ["kazoo"], "coord jumped ahead of kazoo"
                assert await kz.ask("unlock") == "unlocked"
            assert order == ["kazoo", "coord-2"]


async def test_leader_both_ways(zookeeper_server: ZooKeeperServer, zookeeper_url: str) -> None:
    path = zk_path(zookeeper_url, "e")
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            election = client.election("e")
            assert await election.leader() is None
            assert await kz.ask(f"elect {path} kazoo-1") == f"leader {path} kazoo-1"
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"kazoo-1"
            assert await kz.ask("unlock") == "unlocked"
            async with election.campaign(b"coord-1") as term:
                assert await kz.ask(f"leader-of {path}") == f"leader-of {path} coord-1"
                await kz.send(f"elect {path} kazoo-2")
                await wait_children(client, "e", 2)
                assert (await election.leader()) == coord.Leader(term.key, b"coord-1", term.fence)
            assert await kz.line() == f"leader {path} kazoo-2"
            leader = await election.leader()
            assert leader is not None
            assert leader.value == b"kazoo-2"
            with pytest.raises(coord.ConfigurationError, match="UTF-8"):
                election.campaign(b"\xff")


async def test_sigkilled_kazoo_holder_passes_to_coord(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            await kz.ask(f"lock {zk_path(zookeeper_url, 'a')} doomed")
            granted: list[float] = []

            async def take() -> None:
                async with client.mutex("a"):
                    granted.append(anyio.current_time())

            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                await wait_children(client, "a", 2)
                killed = anyio.current_time()
                kz.kill()
            assert granted[0] - killed < 5  # the peer's 1 s session, and slack


async def test_sigkilled_coord_holder_passes_to_kazoo(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """A coord holder in a process of its own (the CLI), SIGKILLed: its session (1 s)
    expires and the kazoo waiter gets the lock."""
    path = zk_path(zookeeper_url, "a")
    argv = [
        *_coord_cli(),
        "lock",
        "--layout",
        "kazoo",
        "--ttl",
        "1",
        "a",
        "--",
        "sh",
        "-c",
        "echo held; sleep 60",
    ]
    with anyio.fail_after(20):
        async with (
            connect(zookeeper_url) as client,
            kazoo_peer(zookeeper_server.endpoint) as kz,
            await anyio.open_process(argv, env=_env(zookeeper_url), stderr=None) as cli,
        ):
            assert cli.stdout is not None
            assert (await cli.stdout.receive()).startswith(b"held")
            await kz.send(f"lock {path} kazoo")
            await wait_children(client, "a", 2)
            cli.kill()
            line = await kz.line()
            assert line.startswith(f"locked {path} ")


def _coord_cli() -> list[str]:
    return [sys.executable, "-m", "coord.cli"]


def _env(url: str) -> dict[str, str]:
    return {**os.environ, "COORD_URL": url}


async def test_cancelled_waiters_leave_no_node(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Behind a kazoo holder, an anyio-cancelled and a natively cancelled coord waiter
    leave nothing: kazoo's node is the only child."""
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            await kz.ask(f"lock {zk_path(zookeeper_url, 'a')} k")
            with anyio.move_on_after(0.3):
                await client.mutex("a").acquire()
            task = asyncio.ensure_future(client.mutex("a").acquire())
            await wait_children(client, "a", 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(50):
                if len((await client.backend.child_names("a/")).names) == 1:
                    break
                await anyio.sleep(0.05)
            names = (await client.backend.child_names("a/")).names
            assert len(names) == 1
            assert "__lock__" in names[0]


async def test_lost_hold_cancels_body(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Another client deletes the holder's node: the body is cancelled, LockLost raised."""
    reached_end = False
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, raw_client(zookeeper_server.endpoint) as zk:
            with pytest.raises(coord.LockLost):
                async with client.mutex("a") as hold:
                    await zk.delete(zk_path(zookeeper_url, hold.key))
                    await anyio.sleep(10)
                    reached_end = True
    assert not reached_end


async def test_rwlock_with_kazoo(zookeeper_server: ZooKeeperServer, zookeeper_url: str) -> None:
    """A kazoo reader holds: coord's reader shares it, coord's writer waits for both."""
    path = zk_path(zookeeper_url, "rw")
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            assert (await kz.ask(f"read {path} kr")).startswith("locked")
            rw = client.rwlock("rw")
            assert rw.read.layout == "kazoo"
            writer = anyio.Event()

            async def write() -> None:
                async with rw.write:
                    writer.set()

            async with anyio.create_task_group() as tg:
                async with rw.read:
                    tg.start_soon(write)
                    await wait_children(client, "rw", 3)
                    holding = [w.holding for w in await rw.write.waiters()]
                    assert holding == [True, True, False]
                    await anyio.sleep(0.2)
                    assert not writer.is_set()
                    assert await kz.ask("unlock") == "unlocked"
                    await anyio.sleep(0.2)
                    assert not writer.is_set()  # coord's reader still holds
                await writer.wait()


async def test_waiter_outlives_its_session(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """A coord waiter behind kazoo whose session expires waits again on the next one,
    and gets the lock when kazoo lets go; its old node went with its session."""
    with anyio.fail_after(15):
        async with connect(zookeeper_url) as client, kazoo_peer(zookeeper_server.endpoint) as kz:
            await kz.ask(f"lock {zk_path(zookeeper_url, 'a')} k")
            first = client.session
            held: list[coord.Hold] = []

            async def take() -> None:
                async with client.mutex("a") as hold:
                    held.append(hold)

            async with anyio.create_task_group() as tg:
                tg.start_soon(take)
                before = await wait_children(client, "a", 2)
                await expire_session(client)
                while True:  # until the waiter's node of its next session is there
                    try:
                        children = await client.backend.child_names("a/")
                    except coord.SessionExpiredError:
                        await anyio.sleep(0.05)  # the backend is between sessions
                        continue
                    if set(children.names) - set(before):
                        break
                    await client.backend.wait_keys_changed("a/", revision=children.revision)
                assert await kz.ask("unlock") == "unlocked"
            assert held[0].session is not first
            assert held[0].key.rpartition("/")[2] not in before
