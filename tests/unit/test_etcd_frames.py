"""The etcd transport against a scripted hostile HTTP/2 server (``_h2_script.py``): each
frame that breaks RFC 9113's rules is sent before a well-formed reply, so a client that
let it through would succeed. It must instead drop the connection at once (the call
fails as UNAVAILABLE, naming what was wrong; through coord's connection, a
``BackendUnavailable`` or a failover to the next member), with nothing left to hang on.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import pytest
from aetcd import rpc

from coord import BackendUnavailable
from coord.backends.etcd._connection import Connection
from coord.backends.etcd._grpc import Channel, RpcError

from ._etcd_loops import ASYNCIO, transport_loops
from ._h2_script import (
    CONTINUATION,
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    h2,
    reply,
    scripted,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup

    from coord.testing import EtcdServer

pytestmark = pytest.mark.anyio


anyio_backend = transport_loops()


def _setting(key: int, value: int) -> bytes:
    return h2(SETTINGS, 0, 0, struct.pack(">HI", key, value))


#: Each case: the frames a hostile server sends on receiving the request on stream *sid*;
#: then a good reply, unless the case ends "then silence".
HOSTILE: dict[str, Callable[[int], bytes]] = {
    "frame over SETTINGS_MAX_FRAME_SIZE": lambda sid: h2(0x20, 0, 0, b"x" * 16_385),
    "frame length 2^24-1, then silence": lambda sid: h2(DATA, 0, sid, b"", length=2**24 - 1),
    "CONTINUATION without end, then silence": lambda sid: (
        h2(HEADERS, 0, sid, b"\x88") + h2(CONTINUATION, 0, sid, b"\x88" * 16_384) * 8
    ),
    "SETTINGS length not a multiple of 6": lambda sid: h2(SETTINGS, 0, 0, b"\0\4\0\0\0\1\0"),
    "SETTINGS_MAX_FRAME_SIZE 0": lambda sid: _setting(5, 0),
    "SETTINGS_MAX_FRAME_SIZE 2^24": lambda sid: _setting(5, 2**24),
    "SETTINGS_INITIAL_WINDOW_SIZE 2^31": lambda sid: _setting(4, 2**31),
    "SETTINGS_ENABLE_PUSH 1": lambda sid: _setting(2, 1),
    "SETTINGS ACK with a payload": lambda sid: h2(SETTINGS, 1, 0, b"\0" * 6),
    "WINDOW_UPDATE 0": lambda sid: h2(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"),
    "WINDOW_UPDATE 0 on a stream": lambda sid: h2(WINDOW_UPDATE, 0, sid, b"\0\0\0\0"),
    "connection window past 2^31-1": lambda sid: h2(
        WINDOW_UPDATE, 0, 0, (2**31 - 1).to_bytes(4, "big")
    ),
    "stream window past 2^31-1": lambda sid: h2(
        WINDOW_UPDATE, 0, sid, (2**31 - 1).to_bytes(4, "big")
    ),
    "pad length over the frame": lambda sid: h2(DATA, 0x8, sid, b"\x05abc"),
    "HEADERS too short for its priority": lambda sid: h2(HEADERS, 0x24, sid + 2, b"\0\0"),
    "PING ACK never asked for": lambda sid: h2(PING, 1, 0, b"\0" * 8),
    "PING of 7 bytes": lambda sid: h2(PING, 0, 0, b"\0" * 7),
    "PUSH_PROMISE though push is off": lambda sid: h2(PUSH_PROMISE, 4, sid, b"\0\0\0\2\x88"),
    "DATA on an even (server) stream": lambda sid: h2(DATA, 0, 2, b"\0\0\0\0\0"),
    "HEADERS on an idle stream": lambda sid: h2(HEADERS, 4, sid + 2, b"\x88"),
    "RST_STREAM on an idle stream": lambda sid: h2(RST_STREAM, 0, sid + 100, b"\0\0\0\x08"),
    "RST_STREAM of 3 bytes": lambda sid: h2(RST_STREAM, 0, sid, b"\0\0\x08"),
    "GOAWAY of 4 bytes": lambda sid: h2(GOAWAY, 0, 0, b"\0\0\0\0"),
    "DATA on stream 0": lambda sid: h2(DATA, 0, 0, b"\0\0\0\0\0"),
}


async def _range(channel: Channel, deadline: float = 2.0) -> Any:
    return await rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"k"), timeout=deadline)


async def test_the_scripted_server_serves_a_well_formed_reply(tasks: TaskGroup) -> None:
    """The control: the same server with no hostile frame is served (so each case below
    fails for its hostile frame, not for the script)."""
    async with scripted(reply) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            with anyio.fail_after(3):
                answer = await _range(channel)
            assert answer == rpc.RangeResponse()
            assert script.requests == [1]
        finally:
            await channel.close()


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_frame_drops_the_connection(tasks: TaskGroup, case: str) -> None:
    """The hostile frame, then a good reply: the call fails as UNAVAILABLE at once (long
    before its deadline), saying HTTP/2 was broken, and the client closes the
    connection; the next call opens a new one."""
    hostile = HOSTILE[case]
    good = (lambda sid: b"") if case.endswith("then silence") else reply
    async with scripted(lambda sid: hostile(sid) + good(sid)) as (port, script):
        channel = Channel("127.0.0.1", port, reconnect_backoff=(0.01, 0.01), spawn=tasks.start_soon)
        try:
            started = time.monotonic()
            with pytest.raises(RpcError) as info:
                await _range(channel, deadline=5.0)
            assert time.monotonic() - started < 2.0
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "HTTP/2 does not allow" in (info.value.details() or "")
            with anyio.fail_after(2):
                await script.closed.wait()
            await anyio.sleep(0.02)  # past the reconnect backoff
            with pytest.raises(RpcError):
                await _range(channel)
            assert script.connections == 2
        finally:
            await channel.close()


async def test_a_hostile_member_fails_over_to_the_next(etcd_server: EtcdServer) -> None:
    """Through coord's connection, a member that breaks HTTP/2 (then says nothing more)
    costs one attempt: the request goes to the next member and is served there, well
    within the request timeout."""
    settings = HOSTILE["SETTINGS length not a multiple of 6"]
    async with scripted(settings) as (port, _):
        host, etcd_port = etcd_server.endpoint.rsplit(":", 1)
        conn = Connection((("127.0.0.1", port), (host, int(etcd_port))), request_timeout=10.0)
        await conn.open()
        try:
            started = time.monotonic()
            answer = await conn.call("range", lambda c: c.kv.Range, rpc.RangeRequest(key=b"k"))
            assert answer.header.revision > 0
            assert time.monotonic() - started < 2.0
        finally:
            await conn.close()


async def test_a_truncated_frame_then_silence_ends_in_the_request_timeout() -> None:
    """Half a frame, then nothing: the call ends as BackendUnavailable in its time (no
    hang), and nothing spins while the client waits or after."""
    async with scripted(lambda sid: reply(sid)[:20]) as (port, _):
        conn = Connection((("127.0.0.1", port),), request_timeout=1.0)
        await conn.open()
        try:
            started, cpu = time.monotonic(), time.process_time()
            with pytest.raises(BackendUnavailable):
                await conn.call("range", lambda c: c.kv.Range, rpc.RangeRequest(key=b"k"))
            assert time.monotonic() - started < 1.5
            assert time.process_time() - cpu < 0.5
        finally:
            await conn.close()


async def test_goaway_mid_stream_fails_the_unprocessed_call(tasks: TaskGroup) -> None:
    """GOAWAY naming no stream as processed, after the reply's headers: the call fails as
    UNAVAILABLE (it never ran: safe to repeat elsewhere) and the connection is closed."""

    def answer(sid: int) -> bytes:
        whole = reply(sid)
        headers = whole[: 9 + int.from_bytes(whole[:3], "big")]
        return headers + h2(GOAWAY, 0, 0, b"\0" * 8)

    async with scripted(answer) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            with anyio.fail_after(2), pytest.raises(RpcError) as info:
                await _range(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "GOAWAY" in (info.value.details() or "")
            with anyio.fail_after(2):
                await script.closed.wait()
        finally:
            await channel.close()


async def test_a_storm_of_refused_streams_ends_after_a_few_tries(tasks: TaskGroup) -> None:
    """Every stream refused (RST_STREAM REFUSED_STREAM, "not processed"): the call goes
    again a bounded number of times, then fails as UNAVAILABLE; no endless retry."""
    refused = lambda sid: h2(RST_STREAM, 0, sid, b"\0\0\0\x07")  # noqa: E731
    async with scripted(refused) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            with anyio.fail_after(2), pytest.raises(RpcError) as info:
                await _range(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            await anyio.sleep(0.1)
            assert 2 <= len(script.requests) <= 4
        finally:
            await channel.close()


async def test_resets_of_closed_streams_are_ignored(tasks: TaskGroup) -> None:
    """RFC 9113, 5.1: frames on a stream we closed may still arrive; thousands of
    RST_STREAM frames on the finished stream leave the connection serving the next call."""

    def answer(sid: int) -> bytes:
        storm = h2(RST_STREAM, 0, 1, b"\0\0\0\x08") * 5000 if sid == 3 else b""
        return storm + reply(sid)

    async with scripted(answer) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            with anyio.fail_after(3):
                await _range(channel)
                await _range(channel)
                await _range(channel)
            assert script.requests == [1, 3, 5]
            assert script.connections == 1
        finally:
            await channel.close()


async def test_a_message_over_the_receive_limit_ends_its_call_not_the_connection(
    tasks: TaskGroup,
) -> None:
    """A reply whose gRPC length prefix says 2^32-1 bytes (the limit here: 1 KiB) ends
    that call as RESOURCE_EXHAUSTED as soon as the prefix arrives, nothing of it is
    buffered, and the stream is reset; gRPC's rule for one oversized message, which may be
    a legitimate reply too large for the client, so the connection goes on serving."""

    def answer(sid: int) -> bytes:
        if sid != 1:
            return reply(sid)
        whole = reply(sid)
        headers = whole[: 9 + int.from_bytes(whole[:3], "big")]
        return headers + h2(DATA, 0, sid, b"\0\xff\xff\xff\xff")

    async with scripted(answer) as (port, script):
        channel = Channel("127.0.0.1", port, max_receive=1024, spawn=tasks.start_soon)
        try:
            with anyio.fail_after(2), pytest.raises(RpcError) as info:
                await _range(channel)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            with anyio.fail_after(2):
                assert await _range(channel) == rpc.RangeResponse()
            assert script.connections == 1
        finally:
            await channel.close()


async def test_a_server_that_sends_past_a_streams_window_is_dropped(tasks: TaskGroup) -> None:
    """A stream's replies that its reader has not taken are not given back to its window,
    so a server that goes on sending to a reader that does not read breaks flow control
    (RFC 9113, 6.9.1): the connection is dropped, and no more than a window is held."""
    message = b"\0" + (16_000).to_bytes(4, "big") + b"x" * 16_000

    def answer(sid: int) -> bytes:
        whole = reply(sid)
        headers = whole[: 9 + int.from_bytes(whole[:3], "big")]
        return headers + h2(DATA, 0, sid, message) * 8  # 128 KB, twice the window

    async with scripted(answer) as (port, script):
        channel = Channel("127.0.0.1", port, stream_window=65_536, spawn=tasks.start_soon)
        try:
            call = rpc.WatchStub(channel).Watch()
            create = rpc.WatchCreateRequest(key=b"k")
            await call.write(rpc.WatchRequest(create_request=create))
            with anyio.fail_after(2):
                await script.closed.wait()
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
            assert sum(len(r) + 5 for r in call._replies) <= 65_536
        finally:
            await channel.close()


async def _cancelled_call(tasks: TaskGroup, native: bool) -> None:
    """A call cancelled while awaited resets its stream (RST_STREAM CANCEL) and leaves no
    stream open on the connection; the next call on it is served."""
    answered = [False]

    def answer(sid: int) -> bytes:
        if answered[0] or sid == 1:
            return b""  # the first request: no answer
        answered[0] = True
        return reply(sid)

    async with scripted(answer) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            call = rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"k"), timeout=10)
            if native:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await call
            else:
                with anyio.move_on_after(0.2):
                    await call
            assert call.cancelled()
            with anyio.fail_after(3):
                await script.reset.wait()
            assert script.resets == [1]
            conn = channel._conn
            assert conn is not None
            assert not conn._streams
            with anyio.fail_after(3):
                assert await _range(channel) == rpc.RangeResponse()
        finally:
            await channel.close()


async def test_a_call_cancelled_by_its_scope_resets_its_stream(tasks: TaskGroup) -> None:
    await _cancelled_call(tasks, native=False)


@pytest.mark.parametrize("transport_loop", ASYNCIO, indirect=True)
async def test_a_call_cancelled_natively_resets_its_stream(tasks: TaskGroup) -> None:
    """``asyncio.timeout`` (a native ``task.cancel()``), as the scope does."""
    await _cancelled_call(tasks, native=True)
