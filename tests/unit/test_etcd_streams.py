"""The etcd backend's gRPC transport (``coord/backends/etcd/_http2.py``): its edge cases
against a member that hangs (a listening socket that accepts connections and never
speaks), one that refuses, and a real etcd (flow control, big messages, a server that
goes away, cancellation)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest
from aetcd import rpc

from coord import BackendUnavailable
from coord.backends.etcd._connection import stream_read, stream_write
from coord.backends.etcd._http2 import Channel, RpcError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from coord.testing import EtcdServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the etcd backend is asyncio's


@pytest.fixture
def silent_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture
async def channel(silent_port: int) -> AsyncIterator[Channel]:
    channel = Channel("127.0.0.1", silent_port, keepalive=0.3, keepalive_timeout=0.3)
    yield channel
    await channel.close()


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[Channel]:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    channel = Channel(host, int(port))
    yield channel
    await channel.close()


def _create(key: bytes = b"k") -> rpc.WatchRequest:
    return rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key))


def _txn(channel: Channel, timeout: float = 30) -> Any:
    return rpc.KVStub(channel).Txn(rpc.TxnRequest(), timeout=timeout)


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
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(_create())


async def test_a_call_never_starts_on_a_connection_lost_before_its_turn(
    channel: Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made while the channel connects starts once the connection is up, in a task
    of the channel; a connection lost before that task ran (a member that accepts and
    drops connections while it starts) must end the call. Started on it instead, the
    call waited for ever: its writes went nowhere and nobody ended it (the watch stream
    of a client hung so after its server was killed and restarted)."""
    conn = await channel._connected()
    conn.abort("dropped at once")

    async def connected() -> Any:
        return conn  # handed out before it was lost, resumed after

    monkeypatch.setattr(channel, "_connected", connected)
    call = rpc.WatchStub(channel).Watch()
    with anyio.fail_after(3):
        assert await call.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(BackendUnavailable):
        await stream_write(call, _create())


async def test_a_refused_connection_fails_the_call_and_the_next_at_once() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there
    channel = Channel("127.0.0.1", port, reconnect_backoff=(5.0, 5.0))
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
    replies = await asyncio.gather(
        *(kv.Put(rpc.PutRequest(key=b"http2/n/%d" % i, value=b"%d" % i)) for i in range(200))
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
    etcd_server: EtcdServer,
) -> None:
    host, port = etcd_server.endpoint.rsplit(":", 1)
    channel = Channel(host, int(port), reconnect_backoff=(0.05, 0.1))
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
