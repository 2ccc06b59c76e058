"""The wire client's session against a scripted server on loopback (no ZooKeeper): what a
real server rarely does on demand — a read-only answer, a reply out of order, silence,
an "expired" answer to a resume, a refused auth packet."""

from __future__ import annotations

import math
import struct
import time

import anyio
import anyio.lowlevel
import pytest
from kazoo import exceptions as kz
from kazoo.protocol.states import EventType

from coord.backends.zookeeper._wire import State, Watcher, WireClient

from ._zk_script import PASSWORD, STAT, Peer, start


async def test_a_read_only_server_is_refused(tasks: anyio.abc.TaskGroup) -> None:
    async def read_only(peer: Peer) -> None:
        await peer.connect(read_only=True)
        await peer.frame()  # until the client hangs up

    server = await start(tasks, read_only)
    hosts = [("127.0.0.1", server.port)]
    with anyio.fail_after(5), pytest.raises(kz.ConnectionLoss, match="read-only"):
        async with WireClient(hosts, connect_timeout=0.5):
            pass
    assert server.connections >= 2  # tried again, with the same answer
    async with WireClient(hosts, read_only=True) as zk:  # unless read-only will do
        assert zk.state is State.CONNECTED


async def test_a_reply_out_of_order_drops_the_connection(tasks: anyio.abc.TaskGroup) -> None:
    resumed: list[tuple[int, int]] = []

    async def out_of_order(peer: Peer) -> None:
        await peer.connect()
        xid, _, _ = await peer.request()
        await peer.reply(xid, struct.pack("!i", 1) + b"x" + STAT, zxid=77)
        xid, _, _ = await peer.request()
        await peer.reply(xid + 1)
        await peer.frame()

    async def resume(peer: Peer) -> None:
        resumed.append(await peer.connect())
        await peer.serve_requests()

    server = await start(tasks, out_of_order, resume)
    states: list[State] = []
    async with WireClient([("127.0.0.1", server.port)]) as zk:
        zk.add_listener(states.append)
        assert (await zk.get_data("/a"))[0] == b"x"
        with pytest.raises(kz.ConnectionLoss):
            await zk.get_data("/b")
        with anyio.fail_after(5):
            assert (await zk.get_data("/c"))[0] == b"data"
        assert resumed == [(0x1234, 77)]  # the same session, from the last zxid seen
        assert zk.password == PASSWORD
    assert states == [State.SUSPENDED, State.CONNECTED, State.CLOSED]


async def test_silence_drops_the_connection_and_an_expired_answer_ends_the_session(
    tasks: anyio.abc.TaskGroup,
) -> None:
    pings: list[float] = []

    async def silent(peer: Peer) -> None:
        await peer.connect(timeout_ms=600)
        xid, _, _ = await peer.request()  # the exists that arms a watch
        await peer.reply(xid, STAT)
        while True:  # then not a word
            await peer.frame()
            pings.append(anyio.current_time())

    async def expired(peer: Peer) -> None:
        await peer.connect(session_id=0, timeout_ms=0)
        await peer.frame()

    server = await start(tasks, silent, expired)
    states: list[State] = []
    async with WireClient([("127.0.0.1", server.port)], session_timeout=0.6) as zk:
        zk.add_listener(states.append)
        watcher = Watcher()
        assert await zk.exists("/w", watch=watcher) is not None
        answered = anyio.current_time()
        with anyio.fail_after(5):
            event = await watcher.wait()
        assert (event.type, event.path) == (EventType.NONE, "/w")
        assert pings  # a ping every 0.2 s, none answered: dropped after 0.4 s
        with pytest.raises(kz.SessionExpiredError):
            await zk.exists("/")
        assert anyio.current_time() - answered > 0.3
    assert states == [State.SUSPENDED, State.LOST]


async def test_pings_keep_a_quiet_session(tasks: anyio.abc.TaskGroup) -> None:
    async def answering(peer: Peer) -> None:
        await peer.connect(timeout_ms=600)
        await peer.serve_requests()

    server = await start(tasks, answering)
    async with WireClient([("127.0.0.1", server.port)], session_timeout=0.6) as zk:
        await anyio.sleep(1.5)  # over twice the session timeout, with nothing to send
        assert zk.state is State.CONNECTED
        assert (await zk.get_data("/a"))[0] == b"data"
    assert server.connections == 1


async def test_a_blocked_event_loop_is_not_the_servers_silence(
    tasks: anyio.abc.TaskGroup,
) -> None:
    """The loop blocked for longer than the silence bound (2/3 of the timeout) but not the
    timeout, three times: the connection stays (the server answers the ping sent after
    each stall). It used to be dropped on waking, which voids every hold of the session
    and lost the 10,000-waiter test its sessions on a loaded machine."""

    async def answering(peer: Peer) -> None:
        await peer.connect(timeout_ms=600)
        await peer.serve_requests()

    server = await start(tasks, answering)
    states: list[State] = []
    async with WireClient([("127.0.0.1", server.port)], session_timeout=0.6) as zk:
        zk.add_listener(states.append)
        for _ in range(3):
            assert (await zk.get_data("/a"))[0] == b"data"
            time.sleep(0.5)  # noqa: ASYNC251  (the stall under test)
            await anyio.sleep(0.1)
        assert zk.state is State.CONNECTED
        assert (await zk.get_data("/a"))[0] == b"data"
    assert server.connections == 1
    assert states == [State.CLOSED]


async def test_a_server_silent_after_a_stall_drops_the_connection(
    tasks: anyio.abc.TaskGroup,
) -> None:
    """The ping sent after a stall is judged like any other: unanswered, the connection
    drops a third of the timeout later."""
    stalled = anyio.Event()

    async def mute_after_the_stall(peer: Peer) -> None:
        await peer.connect(timeout_ms=600)
        with anyio.move_on_after(math.inf) as serving:
            async with anyio.create_task_group() as tg:
                tg.start_soon(peer.serve_requests)
                await stalled.wait()
                serving.cancel()
        while True:
            await peer.frame()

    server = await start(tasks, mute_after_the_stall)
    states: list[State] = []
    dropped = anyio.Event()

    def listen(state: State) -> None:
        states.append(state)
        dropped.set()

    async with WireClient([("127.0.0.1", server.port)], session_timeout=0.6) as zk:
        zk.add_listener(listen)
        assert (await zk.get_data("/a"))[0] == b"data"
        stalled.set()
        time.sleep(0.5)  # noqa: ASYNC251  (the stall)
        woke = anyio.current_time()
        with anyio.fail_after(5):
            await dropped.wait()
        assert states[0] is State.SUSPENDED
        assert 0.15 <= anyio.current_time() - woke < 1.5  # the fresh ping had its third


async def test_a_dead_server_is_found_out_while_the_loop_stays_busy(
    tasks: anyio.abc.TaskGroup,
) -> None:
    """A loop late at every wake (blocked in 30 ms slices, with a 0.6 s timeout) is
    forgiven one stall, not every one: a server that keeps the connection open but
    answers nothing is still dropped within about the usual time (it never was while
    each late wake restarted the judgement, found by a review)."""
    muted = anyio.Event()

    async def answer_then_mute(peer: Peer) -> None:
        await peer.connect(timeout_ms=600)
        xid, _, _ = await peer.request()
        await peer.reply(xid, struct.pack("!i", 4) + b"data" + STAT)
        muted.set()
        while True:
            await peer.frame()  # reads everything, answers nothing

    server = await start(tasks, answer_then_mute)
    dropped = anyio.Event()
    async with WireClient([("127.0.0.1", server.port)], session_timeout=0.6) as zk:
        zk.add_listener(lambda state: dropped.set() if state is State.SUSPENDED else None)
        await zk.get_data("/a")
        await muted.wait()
        began = anyio.current_time()
        async with anyio.create_task_group() as tg:

            async def busy() -> None:
                while True:
                    time.sleep(0.03)  # noqa: ASYNC251  (a loop kept busy)
                    await anyio.lowlevel.checkpoint()

            tg.start_soon(busy)
            with anyio.fail_after(5):
                await dropped.wait()
            tg.cancel_scope.cancel()
        assert anyio.current_time() - began < 2.5


async def test_refused_credentials_end_the_session(tasks: anyio.abc.TaskGroup) -> None:
    async def refusing(peer: Peer) -> None:
        await peer.connect()
        xid, opcode, _ = await peer.request()
        assert (xid, opcode) == (-4, 100)
        await peer.reply(-4, err=kz.AuthFailedError.code)
        await peer.frame()

    server = await start(tasks, refusing)
    hosts = [("127.0.0.1", server.port)]
    with anyio.fail_after(5), pytest.raises(kz.AuthFailedError):
        async with WireClient(hosts, auth=[("digest", "a:b")]):
            pass
    assert server.connections == 1  # not retried: the same credentials would fail again
