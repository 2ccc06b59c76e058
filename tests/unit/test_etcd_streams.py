"""The etcd backend's gRPC transport (``coord/backends/etcd/_grpc/``): its edge cases
against a member that hangs (a listening socket that accepts connections and never
speaks), one that refuses, and a real etcd (flow control, big messages, a server that
goes away, cancellation)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import grpc
import hpack
import pytest
from aetcd import rpc

from coord import BackendUnavailable
from coord.backends.etcd._connection import stream_read, stream_write
from coord.backends.etcd._grpc import CallEnded, Channel, RpcError
from coord.backends.etcd._grpc._connection import _Connection

from ._etcd_loops import ASYNCIO, transport_loops

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from anyio.abc import TaskGroup

    from coord.testing import EtcdServer

pytestmark = pytest.mark.anyio


anyio_backend = transport_loops()


@pytest.fixture
def silent_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture
async def channel(tasks: TaskGroup, silent_port: int) -> AsyncIterator[Channel]:
    channel = Channel(
        "127.0.0.1", silent_port, keepalive=0.3, keepalive_timeout=0.3, spawn=tasks.start_soon
    )
    yield channel
    await channel.close()


@pytest.fixture
async def etcd(tasks: TaskGroup, etcd_server: EtcdServer) -> AsyncIterator[Channel]:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    channel = Channel(host, int(port), spawn=tasks.start_soon)
    yield channel
    await channel.close()


def _create(key: bytes = b"k") -> rpc.WatchRequest:
    return rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key))


def _txn(channel: Channel, timeout: float = 30) -> Any:
    return rpc.KVStub(channel).Txn(rpc.TxnRequest(), timeout=timeout)


async def _gather(calls: list[Any]) -> list[Any]:
    """Await *calls* at once, each in a task: their replies, in order."""
    replies: list[Any] = [None] * len(calls)

    async def one(i: int) -> None:
        replies[i] = await calls[i]

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return replies


# -- a member that hangs -------------------------------------------------------------------------


async def test_a_write_held_back_by_flow_control_ends_when_the_channel_closes(
    channel: Channel,
) -> None:
    """A write the server's window holds back (it never grants more) must fail when the
    channel closes under it (a failover), or the watch stream hangs for good and no
    waiter of that client hears a deletion again (seen with grpc.aio when a cluster's
    leader was killed)."""
    call = rpc.WatchStub(channel).Watch()
    big = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=b"k" * 100_000))
    failed = anyio.Event()

    async def write() -> None:
        with pytest.raises(BackendUnavailable):
            await stream_write(call, big)
        failed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        await anyio.sleep(0.2)
        assert not failed.is_set()  # more than the initial window of 65,535 bytes: waits
        await channel.close()
        with anyio.fail_after(3):
            await failed.wait()


async def test_a_unary_call_whose_channel_closes_is_unavailable_not_cancelled(
    channel: Channel,
) -> None:
    """A channel closed under a call (a failover) is the store being unreachable, not our
    cancellation, which would escape every cancel scope as a bare CancelledError."""
    failed = anyio.Event()

    async def call() -> None:
        with pytest.raises(RpcError) as info:
            await _txn(channel)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        failed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(0.1)
        await channel.close()
        with anyio.fail_after(3):
            await failed.wait()


async def test_a_cancelled_unary_call_is_cancelled_and_the_scope_catches_it(
    channel: Channel,
) -> None:
    call = _txn(channel)
    with anyio.move_on_after(0.1) as scope:
        await call
    assert scope.cancelled_caught
    assert call.cancelled()
    assert call.done()


@pytest.mark.parametrize("transport_loop", ASYNCIO, indirect=True)
async def test_a_natively_cancelled_unary_call_is_cancelled(channel: Channel) -> None:
    call = _txn(channel)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await call
    assert call.cancelled()


async def test_a_call_past_its_deadline_fails_as_deadline_exceeded(channel: Channel) -> None:
    with pytest.raises(RpcError) as info:
        await _txn(channel, timeout=0.1)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_an_unanswered_ping_ends_the_calls_on_the_connection(channel: Channel) -> None:
    """A member that hangs (SIGSTOPped, partitioned without a reset) is found by the ping
    that gets no answer, and every open call fails: nothing waits on it for ever."""
    call = rpc.WatchStub(channel).Watch()
    started = time.monotonic()
    with anyio.fail_after(3), pytest.raises(RpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "ping" in (info.value.details() or "")
    assert time.monotonic() - started < 2


async def test_a_cancelled_stream_reads_as_cancelled_and_ends(channel: Channel) -> None:
    call = rpc.WatchStub(channel).Watch()
    await call.write(_create())
    call.cancel()
    assert await call.code() == grpc.StatusCode.CANCELLED
    with pytest.raises(CallEnded):
        await call.write(_create())


async def test_a_connection_dropped_as_soon_as_it_is_made_ends_the_calls_waiting(
    tasks: TaskGroup, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls made while the channel connects start once the connection is up; one lost
    before that (a member that accepts and drops connections while it starts) must end
    them. Started on it instead, a call waited for ever: its writes went nowhere and
    nobody ended it (the watch stream of a client hung so after its server was killed
    and restarted)."""
    made = _Connection.connection_made

    def dropped(self: _Connection, transport: Any) -> None:
        made(self, transport)
        self.abort("dropped at once")

    monkeypatch.setattr(_Connection, "connection_made", dropped)
    channel = Channel("127.0.0.1", silent_port, spawn=tasks.start_soon)
    try:
        stream, unary = rpc.WatchStub(channel).Watch(), _txn(channel)
        with anyio.fail_after(3):
            assert await stream.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(RpcError, match="dropped at once"):
                await unary
        with pytest.raises(BackendUnavailable):
            await stream_write(stream, _create())
    finally:
        await channel.close()


async def test_calls_made_as_the_channel_closes_end(tasks: TaskGroup, silent_port: int) -> None:
    """A failover closes the old channel, maybe in the turn in which another task made a
    call on it that waits for its connection: that call ends (UNAVAILABLE), or the
    watch stream that made it would wait for ever."""
    channel = Channel("127.0.0.1", silent_port, spawn=tasks.start_soon)
    stream, unary = rpc.WatchStub(channel).Watch(), _txn(channel)
    await channel.close()
    with anyio.fail_after(3):
        assert await stream.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(RpcError) as info:
            await unary
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(BackendUnavailable):
        await stream_write(stream, _create())


async def test_a_refused_connection_fails_the_call_and_the_next_at_once(tasks: TaskGroup) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there
    channel = Channel("127.0.0.1", port, reconnect_backoff=(5.0, 5.0), spawn=tasks.start_soon)
    try:
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(RpcError) as info:
                await _txn(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 1
    finally:
        await channel.close()


# -- a real etcd ----------------------------------------------------------------------------------


async def test_a_request_and_a_reply_larger_than_the_windows_go_through(etcd: Channel) -> None:
    """Flow control both ways: a put of 1 MB (the server's window is 64 KB at first, its
    frames at most 16 KB) and a read of 2 MB back."""
    kv = rpc.KVStub(etcd)
    value = bytes(range(256)) * 4096  # 1 MiB
    await kv.Put(rpc.PutRequest(key=b"http2/big/1", value=value), timeout=10)
    await kv.Put(rpc.PutRequest(key=b"http2/big/2", value=value[::-1]), timeout=10)
    reply = await kv.Range(rpc.RangeRequest(key=b"http2/big/", range_end=b"http2/big0"), timeout=10)
    assert [kv.value for kv in reply.kvs] == [value, value[::-1]]
    await kv.DeleteRange(rpc.DeleteRangeRequest(key=b"http2/big/", range_end=b"http2/big0"))


async def test_many_calls_at_once_each_get_their_own_reply(etcd: Channel) -> None:
    kv = rpc.KVStub(etcd)
    replies = await _gather(
        [kv.Put(rpc.PutRequest(key=b"http2/n/%d" % i, value=b"%d" % i)) for i in range(200)]
    )
    revisions = [reply.header.revision for reply in replies]
    assert len(set(revisions)) == 200
    reply = await kv.Range(rpc.RangeRequest(key=b"http2/n/", range_end=b"http2/n0"))
    assert sorted(int(kv.value) for kv in reply.kvs) == list(range(200))


async def test_a_server_error_carries_its_status_and_message(etcd: Channel) -> None:
    lease = rpc.LeaseStub(etcd)
    with pytest.raises(RpcError) as info:
        await lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=12345), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "lease not found" in (info.value.details() or "")


async def test_a_watch_stream_delivers_events_and_ends_when_cancelled(etcd: Channel) -> None:
    kv, call = rpc.KVStub(etcd), rpc.WatchStub(etcd).Watch()
    await stream_write(call, _create(b"http2/w"))
    assert (await stream_read(call)).created
    await kv.Put(rpc.PutRequest(key=b"http2/w", value=b"1"))
    events = (await stream_read(call)).events
    assert [bytes(e.kv.value) for e in events] == [b"1"]
    call.cancel()
    assert await call.code() == grpc.StatusCode.CANCELLED


async def test_a_server_that_stops_ends_the_calls_and_the_channel_reconnects(
    tasks: TaskGroup,
    etcd_server: EtcdServer,
) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    channel = Channel(host, int(port), reconnect_backoff=(0.05, 0.1), spawn=tasks.start_soon)
    try:
        call = rpc.WatchStub(channel).Watch()
        await stream_write(call, _create(b"http2/stop"))
        assert (await stream_read(call)).created
        await anyio.to_thread.run_sync(etcd_server.restart)
        with anyio.fail_after(10), pytest.raises(RpcError) as info:
            while True:
                await stream_read(call)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        codes = []
        with anyio.fail_after(20):
            while True:
                try:
                    await _txn(channel, timeout=2)
                    break
                except RpcError as exc:
                    codes.append(exc.code())
                    await anyio.sleep(0.1)
        assert set(codes) <= {grpc.StatusCode.UNAVAILABLE}
        again = rpc.WatchStub(channel).Watch()
        await stream_write(again, _create(b"http2/stop"))
        assert (await stream_read(again)).created
        again.cancel()
    finally:
        await channel.close()


@pytest.fixture
def limited_etcd() -> Iterator[EtcdServer]:
    """An etcd that serves at most four streams per connection."""
    from coord.testing import EtcdServer

    with EtcdServer(extra_args=["--max-concurrent-streams", "4"]) as server:
        yield server


async def test_calls_beyond_the_servers_stream_limit_wait_for_room(
    tasks: TaskGroup,
    limited_etcd: EtcdServer,
) -> None:
    """etcd with --max-concurrent-streams 4: forty calls at once all succeed (the streams
    beyond the limit wait for room; the first ones, sent before the server's SETTINGS
    arrived, are refused unprocessed and go again by themselves)."""
    host, port = limited_etcd.endpoint.rsplit(":", 1)
    channel = Channel(host, int(port), spawn=tasks.start_soon)
    try:
        kv = rpc.KVStub(channel)
        replies = await _gather([kv.Txn(rpc.TxnRequest(), timeout=10) for _ in range(40)])
        assert len(replies) == 40
        watches = [rpc.WatchStub(channel).Watch() for _ in range(3)]
        more = await _gather([kv.Txn(rpc.TxnRequest(), timeout=10) for _ in range(10)])
        assert len(more) == 10  # one stream of room left, taken in turn
        for watch in watches:
            watch.cancel()
    finally:
        await channel.close()


@pytest.mark.parametrize("transport_loop", ASYNCIO, indirect=True)  # (an asyncio server)
async def test_closing_the_channel_ends_the_streams_of_a_connection_going_away(
    tasks: TaskGroup,
) -> None:
    """A server that says GOAWAY keeps serving the streams it had (at or below the last
    stream id it names) while new calls go to a new connection; closing the channel
    (a failover) must end those streams too, not only the current connection's."""
    import hpack

    frames: list[tuple[int, int]] = []  # (type, stream id) of what the client sent
    got_headers = asyncio.Event()

    accepted: list[Any] = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.buffer = transport, b""
            accepted.append(transport)
            transport.write(bytes.fromhex("000000040000000000"))  # SETTINGS, empty

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            if self.buffer.startswith(b"PRI * HTTP/2.0"):
                self.buffer = self.buffer[24:]
            while len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + length:
                    break
                kind, sid = self.buffer[3], int.from_bytes(self.buffer[5:9], "big")
                self.buffer = self.buffer[9 + length :]
                frames.append((kind, sid))
                if kind == 1:  # HEADERS: answer them, then go away keeping this stream
                    block = hpack.Encoder().encode(
                        [(":status", "200"), ("content-type", "application/grpc")]
                    )
                    head = len(block).to_bytes(3, "big") + bytes((1, 4)) + sid.to_bytes(4, "big")
                    goaway = bytes.fromhex("000008070000000000") + sid.to_bytes(4, "big")
                    self.transport.write(head + block + goaway + bytes(4))
                    got_headers.set()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Server, "127.0.0.1", 0)
    channel = Channel("127.0.0.1", server.sockets[0].getsockname()[1], spawn=tasks.start_soon)
    try:
        call = rpc.WatchStub(channel).Watch()
        with anyio.fail_after(3):
            await got_headers.wait()
            await anyio.sleep(0.1)  # the GOAWAY is read
        assert not call.done()  # kept: at or below the last stream id
        await channel.close()
        with anyio.fail_after(3):
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for transport in accepted:  # (server.close() leaves accepted connections open)
            transport.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("turns", range(12))
async def test_a_channel_closed_while_it_connects_keeps_no_connection(
    tasks: TaskGroup, silent_port: int, turns: int
) -> None:
    """Closed at any turn of the loop while its connection is being made (a failover
    under a call that waits for it), the channel ends the call and keeps no connection:
    on Python 3.11, asyncio.wait_for returned a connection made as its task was
    cancelled, which then served the call (and new ones) on the closed channel."""
    channel = Channel("127.0.0.1", silent_port, spawn=tasks.start_soon)
    call = _txn(channel)
    for _ in range(turns):
        await anyio.lowlevel.checkpoint()
    await channel.close()
    with anyio.fail_after(3), pytest.raises(RpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not channel._live
    assert channel._current() is None
    with anyio.fail_after(3), pytest.raises(RpcError):
        await _txn(channel)  # and a new call on the closed channel ends at once


async def test_a_header_block_decoded_from_memory_follows_the_table(tasks: TaskGroup) -> None:
    """A block that decoded without changing HPACK's dynamic table is decoded from
    memory while the table stays as it was; once another block changes the table, the
    same bytes (an index into the table) decode to what the table now holds."""
    encoder = hpack.Encoder()
    conn = _Connection(Channel("127.0.0.1", 1, spawn=tasks.start_soon))
    first = encoder.encode([(b"grpc-status", b"0")])  # a literal, indexed: table changes
    assert conn._fields(first) == {b"grpc-status": b"0"}
    again = encoder.encode([(b"grpc-status", b"0")])  # an index into the table
    assert again != first
    assert conn._fields(again) == {b"grpc-status": b"0"}
    assert conn._fields(again) is conn._fields(again)  # from memory
    other = encoder.encode([(b"grpc-status", b"5")])  # a new entry at the same index
    assert conn._fields(other) == {b"grpc-status": b"5"}
    assert conn._fields(again) == {b"grpc-status": b"5"}  # same bytes, the new table's
    assert encoder.encode([(b"grpc-status", b"5")]) == again
