"""gRPC stream edge cases of the etcd backend that need no etcd: a listening socket that
accepts connections and never speaks is a member that hangs during the handshake."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest
from aetcd import rpc

from coord import BackendUnavailable
from coord.backends.etcd._connection import guarded, stream_write

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # grpc.aio


@pytest.fixture
def silent_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture
async def channel(silent_port: int) -> AsyncIterator[grpc.aio.Channel]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{silent_port}")
    yield channel
    await channel.close(grace=None)
    # gRPC's poller thread delivers the closed calls' last events a moment later; the
    # event loop must still be there (as in Connection.close).
    await anyio.sleep(0.1)


def _create() -> rpc.WatchRequest:
    return rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=b"k"))


async def test_a_write_waiting_for_the_connection_ends_when_the_channel_closes(
    channel: grpc.aio.Channel,
) -> None:
    """grpc.aio parks a write until the call's headers went out and never wakes it if
    the call ends meanwhile. Failover closes the old channel under the watch stream's
    write: the write must fail then, or the watch stream hangs for good (it did, when a
    cluster's leader was killed) and no waiter of that client hears a deletion again."""
    call = rpc.WatchStub(channel).Watch()
    failed = anyio.Event()

    async def write() -> None:
        with pytest.raises(BackendUnavailable):
            await stream_write(call, _create())
        failed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(write)
        await anyio.sleep(0.5)
        assert not failed.is_set()  # still connecting: the write waits
        await channel.close(grace=None)
        with anyio.fail_after(3):
            await failed.wait()


async def test_a_cancelled_write_ends_its_call(channel: grpc.aio.Channel) -> None:
    """Half a message may have gone out: the stream is unusable, and its owner reopens it."""
    call = rpc.WatchStub(channel).Watch()
    with anyio.move_on_after(0.3) as scope:
        await stream_write(call, _create())
    assert scope.cancelled_caught
    with anyio.fail_after(3):
        assert await call.code() == grpc.StatusCode.CANCELLED


def _txn(channel: grpc.aio.Channel) -> Any:
    return rpc.KVStub(channel).Txn(rpc.TxnRequest(), timeout=30)


async def test_a_unary_call_whose_channel_closes_is_unavailable_not_cancelled(
    channel: grpc.aio.Channel,
) -> None:
    """gRPC cancels the calls of a channel it closes (a failover): that is the store being
    unreachable, not our cancellation, which would escape every cancel scope as a bare
    CancelledError and cancel the caller's task group."""
    failed = anyio.Event()

    async def call() -> None:
        with pytest.raises(BackendUnavailable):
            await guarded(_txn(channel))
        failed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(0.3)
        await channel.close(grace=None)
        with anyio.fail_after(3):
            await failed.wait()


async def test_a_cancelled_unary_call_is_cancelled_and_the_scope_catches_it(
    channel: grpc.aio.Channel,
) -> None:
    call = _txn(channel)
    with anyio.move_on_after(0.3) as scope:
        await guarded(call)
    assert scope.cancelled_caught
    assert call.cancelled()
    assert call.done()
