"""Faults that only a real ZooKeeper shows: a create whose reply is lost, a dropped
connection (SUSPENDED) under both policies, a server that stops answering, a restart
mid-wait."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

import coord
from coord.abc import Entry, Position
from coord.testing import ZooKeeperServer, drop_key, wait_for_waiters

from ._support import CREATE2, Proxy, backend_of, raw_client

if TYPE_CHECKING:
    from coord.backends.zookeeper._wire import WireClient

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


async def test_lost_create_reply_adopts_the_node(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """CURATOR-498: the create is applied by the server but its reply is lost with the
    connection. The node is found by its GUID, is ours (same session), and is adopted:
    one node, not two."""
    caplog.set_level(logging.INFO, logger="coord.backends.zookeeper")
    chroot = zookeeper_url.rsplit("/", 1)[1]
    proxy = Proxy(zookeeper_server.port)
    async with raw_client(zookeeper_server.endpoint) as observer:
        async with anyio.create_task_group() as network:
            await network.start(proxy.serve)
            url = f"zk://127.0.0.1:{proxy.port}/{chroot}"
            async with coord.connect(url, ttl=5, suspended_is_lost=False) as client:
                backend, lease = backend_of(client), client.session.lease
                waiter_id = f"@{uuid.uuid4().hex}"
                result: list[Position] = []

                async def register() -> None:
                    result.append(await backend.register("lost/", waiter_id, lease))

                first = await backend.register("lost/", f"@{uuid.uuid4().hex}", lease)
                with anyio.fail_after(15):
                    async with anyio.create_task_group() as tg:
                        # From the create on, the server's replies are lost.
                        proxy.swallow_from_opcode = CREATE2
                        tg.start_soon(register)
                        await _until_created(observer, f"/{chroot}/lost", waiter_id)
                        proxy.swallow_from_opcode = None
                        proxy.cut()  # the reply is gone for good
                        proxy.swallow_replies = False
                (position,) = result
                assert position.entry.key.startswith(f"lost/{waiter_id}-")
                assert position.entry.lease == lease.id
                assert [e.key for e in position.ahead] == [first.entry.key]
                listing = await backend.entries("lost/")
                keys = [e.key for e in listing.entries]
                assert keys == [first.entry.key, position.entry.key], "a duplicate node"
                assert "adopted" in caplog.text
                assert not lease.lost
            network.cancel_scope.cancel()


async def _until_created(observer: WireClient, parent: str, waiter_id: str) -> None:
    # Polls (a test may): the node appears on the server while its reply is swallowed.
    while True:
        children = await observer.get_children(parent) if await observer.exists(parent) else []
        if any(name.startswith(waiter_id) for name in children):
            return
        await anyio.sleep(0.02)


async def test_a_node_with_my_guid_is_adopted_only_from_my_session(zookeeper_url: str) -> None:
    async with coord.connect(zookeeper_url, ttl=5) as a, coord.connect(zookeeper_url) as b:
        za, zb = backend_of(a), backend_of(b)
        waiter_id = f"@{uuid.uuid4().hex}"
        theirs = await zb.register("guid/", waiter_id, b.session.lease)
        mine = await za.register("guid/", waiter_id, a.session.lease)
        assert mine.entry.key != theirs.entry.key
        assert mine.entry.lease == a.session.lease.id
        assert [e.key for e in mine.ahead] == [theirs.entry.key]
        # Registering the same waiter id again (a retry) returns my existing entry.
        again = await za.register("guid/", waiter_id, a.session.lease)
        assert again.entry == mine.entry
        assert len((await za.entries("guid/")).entries) == 2
        # A provisional entry (registration outcome unknown) deletes only my node.
        provisional = Entry(f"guid/{waiter_id}", lease=a.session.lease.id)
        assert await za.delete(provisional)
        assert [e.key for e in (await za.entries("guid/")).entries] == [theirs.entry.key]
        assert not await za.delete(provisional)


async def test_suspended_connection_voids_holds_but_keeps_the_session(
    zookeeper_url: str, other: coord.Client
) -> None:
    """Curator's default: SUSPENDED means "I cannot be sure I hold it", so the holder is
    cancelled and told at once. But the session survives a short drop: the holder's node
    is deleted as soon as kazoo has reconnected (the next client gets the lock at once,
    not a session timeout later), and a waiter of the same client keeps its place."""
    async with coord.connect(zookeeper_url, ttl=5) as client:
        assert backend_of(client).suspended_is_lost
        session = client.session
        body_cancelled = False
        order: list[str] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def waiter(who: coord.Client, label: str) -> None:
                    async with who.mutex("suspend"):
                        order.append(label)

                with pytest.raises(coord.LockLost, match="interrupted"):
                    async with client.mutex("suspend") as hold:
                        tg.start_soon(waiter, other, "other")
                        await wait_for_waiters(client, "suspend", 2)
                        tg.start_soon(waiter, client, "mine")
                        await wait_for_waiters(client, "suspend", 3)
                        keys = [e.key for e in (await client.backend.entries("suspend/")).entries]
                        try:
                            await backend_of(client).drop_connection()
                            await anyio.sleep_forever()
                        except anyio.get_cancelled_exc_class():
                            body_cancelled = True
                            raise
        assert body_cancelled
        assert order == ["other", "mine"], "the waiter lost its place"
        assert not session.lost, "a short drop must not cost the session"
        assert client.session is session
        assert client.statistics().sessions_lost == 0
        assert hold.lost
        assert len(keys) == 3
        async with client.mutex("suspend") as again:  # the client carries on
            assert again.fence > hold.fence


async def test_tolerant_client_keeps_its_lock_through_a_short_drop(
    tolerant: coord.Client, other: coord.Client
) -> None:
    backend = backend_of(tolerant)
    with anyio.fail_after(10):
        async with tolerant.mutex("tolerant") as hold:
            await backend.drop_connection()
            # This read waits for the reconnection: the session (and my node) survived.
            listing = await backend.entries("tolerant/")
            assert [e.key for e in listing.entries] == [hold.key]
            with pytest.raises(coord.LockedError):
                await other.mutex("tolerant").try_acquire()
            assert not hold.lost
            assert not tolerant.session.lost
        async with other.mutex("tolerant") as next_hold:
            assert next_hold.fence > hold.fence
        # The holder's guard watch was re-armed after the reconnection: it still sees
        # its key being deleted.
        with pytest.raises(coord.LockLost):
            async with tolerant.mutex("tolerant") as hold:
                await drop_key(other, hold.key)
                await hold.wait_lost()
                await anyio.sleep_forever()


async def test_session_presumed_lost_at_its_deadline_when_no_server_answers(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """With suspended_is_lost=False, a client that cannot reach any server declares its
    session lost at its local deadline: the send time of the last acknowledged request
    plus the negotiated timeout. No server is there to say so, and the server cannot
    have expired the session before that moment, nor much after it."""
    ttl = 1.0
    async with coord.connect(zookeeper_url, ttl=ttl, suspended_is_lost=False) as client:
        mutex = client.mutex("silent")
        hold = await mutex.acquire()
        lease = client.session.lease
        assert lease.ttl == ttl  # negotiated: within the test server's bounds
        await anyio.to_thread.run_sync(zookeeper_server.pause)
        try:
            started = anyio.current_time()
            with anyio.fail_after(6):
                await client.session.wait_lost()
            elapsed = anyio.current_time() - started
        finally:
            zookeeper_server.resume()
        # refreshed every ttl / 3: lost between 2/3 ttl and ttl after the last answer
        assert ttl / 2 <= elapsed <= ttl + 0.3, elapsed
        assert hold.lost
        with pytest.raises(coord.LockLost):
            await mutex.release()


async def test_restart_mid_wait_within_the_session_timeout(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Waiters survive a ZooKeeper restart (their sessions do, their watches are armed
    again) and are served in order, by exactly one holder at a time."""
    state = {"inside": 0, "max_inside": 0}
    order: list[int] = []
    async with coord.connect(zookeeper_url, ttl=10, suspended_is_lost=False) as holder_client:
        holder = holder_client.mutex("restart")
        await holder.acquire()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(_waiter, zookeeper_url, i, order, state)
                    await wait_for_waiters(holder_client, "restart", i + 2)
                await anyio.to_thread.run_sync(zookeeper_server.restart)
                await holder.release()  # waits for the reconnection, then deletes
    assert order == [0, 1, 2]
    assert state["max_inside"] == 1


async def _waiter(url: str, number: int, order: list[int], state: dict[str, int]) -> None:
    async with coord.connect(url, ttl=10, suspended_is_lost=False) as client:
        async with client.mutex("restart"):
            state["inside"] += 1
            state["max_inside"] = max(state["max_inside"], state["inside"])
            await anyio.lowlevel.checkpoint()
            order.append(number)
            state["inside"] -= 1


async def test_server_restart_voids_holds_but_no_session_is_lost(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Under the default policy a restart (SUSPENDED) voids every hold at once, but it no
    longer kills the clients: their sessions resume, waiters keep their place, and the
    lock goes on being handed out, in order, by the same clients."""
    order: list[str] = []
    async with (
        coord.connect(zookeeper_url, ttl=10) as a,
        coord.connect(zookeeper_url, ttl=10) as b,
    ):
        sessions = (a.session, b.session)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    async with b.mutex("restart-default"):
                        order.append("b")

                with pytest.raises(coord.LockLost):
                    async with a.mutex("restart-default"):
                        tg.start_soon(waiter)
                        await wait_for_waiters(a, "restart-default", 2)
                        await anyio.to_thread.run_sync(zookeeper_server.restart)
                        await anyio.sleep_forever()
            async with a.mutex("restart-default"):
                order.append("a")
        assert order == ["b", "a"]
        assert (a.session, b.session) == sessions
        assert not any(s.lost for s in sessions)
        assert a.statistics().sessions_lost == b.statistics().sessions_lost == 0


async def test_a_restart_the_session_survives_costs_a_claimed_job_no_attempt(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """A short server restart during a job (SUSPENDED: the claim is voided, the body
    cancelled, the session lives on) gives the job back as it was: no attempt counted.
    With max_attempts=1 a counted attempt would park it (issue 17: two short restarts
    sent a job that never failed to the dead letters)."""
    async with coord.connect(zookeeper_url, ttl=10) as client:
        queue = client.queue("restarts", max_attempts=1)
        await queue.put(b"job", key="k")
        with anyio.fail_after(15):
            for _ in range(2):
                with pytest.raises(coord.ClaimLost) as lost:
                    async with queue.claim() as job:
                        assert job.attempt == 0
                        await anyio.to_thread.run_sync(zookeeper_server.restart)
                        await anyio.sleep_forever()
                assert lost.value.outcome == "not done"
                assert lost.value.job_id == job.id
            async with queue.claim() as job:
                assert (job.payload, job.attempt) == (b"job", 0)
        assert client.statistics().sessions_lost == 0
        assert (await queue.stats()).depth == 0
