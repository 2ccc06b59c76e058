"""The etcd transport answers a server's PING with the next call's frames, in one write.

etcd's server (grpc-go) sends a PING, its bandwidth probe, on reading a request whenever
none is out. Answered at once, each was a write (a system call) of its own, and a read of
etcd's: on a busy connection about every other call (3.4 writes a job of the queue, 2.1
after). The answer now waits for the next write of the connection, at most
``_ANSWER_DELAY`` seconds; a SETTINGS frame is still answered at once.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aetcd import rpc

from coord.backends.etcd._grpc import Channel, _link

from ._etcd_loops import transport_loops
from ._h2_script import HEADERS, PING, SETTINGS, h2, reply, scripted

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

pytestmark = pytest.mark.anyio

anyio_backend = transport_loops()


class _Recorded:
    """A pipe whose writes are recorded: each as the (kind, flags) of its frames."""

    def __init__(self, pipe: Any, writes: list[list[tuple[int, int]]]) -> None:
        self._pipe, self._writes = pipe, writes

    def write(self, data: bytes) -> None:
        raw, frames = bytes(data), []
        rest = raw[24:] if raw.startswith(b"PRI * HTTP/2.0") else raw
        while len(rest) >= 9:
            frames.append((rest[3], rest[4]))
            rest = rest[9 + int.from_bytes(rest[:3], "big") :]
        self._writes.append(frames)
        self._pipe.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, int]]]:
    """What the client's connections write, write by write."""
    recorded: list[list[tuple[int, int]]] = []
    made = _link._Link.connection_made

    def connection_made(self: _link._Link, pipe: Any) -> None:
        made(self, _Recorded(pipe, recorded))

    monkeypatch.setattr(_link._Link, "connection_made", connection_made)
    return recorded


def _pinging(sid: int) -> bytes:
    """A reply after a PING, as etcd's server sends its probe on reading a request; not
    to the first request (whose reply comes with the server's SETTINGS, answered at
    once: see the last test)."""
    return (h2(PING, 0, 0, struct.pack(">Q", sid)) if sid > 1 else b"") + reply(sid)


async def _range(channel: Channel) -> Any:
    with anyio.fail_after(3):
        return await rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"k"))


async def test_a_ping_is_answered_with_the_next_calls_frames(
    tasks: TaskGroup, writes: list[list[tuple[int, int]]]
) -> None:
    async with scripted(_pinging) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            for _ in range(3):
                await _range(channel)
            with anyio.fail_after(3):
                await script.ponged.wait()
        finally:
            await channel.close()
    answer = (PING, 1)
    # The second call's PING is answered in the third call's write, before its HEADERS,
    # and not in a write of its own.
    assert [answer, (HEADERS, 4)] in [frames[:2] for frames in writes]
    first = next(i for i, frames in enumerate(writes) if answer in frames)
    assert writes[first][:2] == [answer, (HEADERS, 4)]
    assert script.pongs[0] == struct.pack(">Q", 3)


async def test_a_ping_with_no_call_after_it_is_answered_within_the_delay(
    tasks: TaskGroup, writes: list[list[tuple[int, int]]]
) -> None:
    async with scripted(_pinging) as (port, script):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            await _range(channel)
            await _range(channel)
            started = anyio.current_time()
            with anyio.fail_after(3):
                await script.ponged.wait()
            waited = anyio.current_time() - started
        finally:
            await channel.close()
    assert [(PING, 1)] in writes  # alone: no call came
    assert script.pongs == [struct.pack(">Q", 3)]
    assert waited < _link._ANSWER_DELAY + 0.5


async def test_settings_are_answered_at_once(
    tasks: TaskGroup, writes: list[list[tuple[int, int]]]
) -> None:
    """A SETTINGS frame's answer does not wait (the peer may wait for it to apply them),
    and takes a PING answer that waits along with it."""
    settings = h2(SETTINGS, 0, 0, struct.pack(">HI", 3, 100))

    def answer(sid: int) -> bytes:
        return (h2(PING, 0, 0, b"\0" * 8) + settings if sid > 1 else b"") + reply(sid)

    async with scripted(answer) as (port, _):
        channel = Channel("127.0.0.1", port, spawn=tasks.start_soon)
        try:
            await _range(channel)
            await _range(channel)
        finally:
            await channel.close()
    assert [(PING, 1), (SETTINGS, 1)] in writes
