"""Property-based fuzzing (hypothesis) of the etcd transport's connection
(``coord/backends/etcd/_grpc/_connection.py``) fed a server's bytes with no socket: over
well-formed replies mutated anywhere and cut anywhere, the connection either acts on them
or drops itself (its calls end as UNAVAILABLE); nothing raises into the event loop, every
call ends at most once, and what it buffers stays bounded. This covers what the frame
parser's fuzzing cannot: HPACK, gRPC's framing, stream states and windows."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import grpc
import hpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coord.backends.etcd._grpc import Channel
from coord.backends.etcd._grpc._connection import _Connection
from coord.backends.etcd._grpc._frames import MAX_FRAME, MAX_HEADER_BLOCK
from coord.backends.etcd._grpc._link import Caller, _Link, _Stream

from ._h2_script import (
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    h2,
    mutated,
)

FUZZ = settings(
    max_examples=200,
    deadline=2000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.aborted = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def close(self) -> None:
        self.aborted = True

    def abort(self) -> None:
        self.aborted = True


class _Probe(Caller):
    """A call that records what the connection tells it."""

    __slots__ = ("_code", "ends", "messages")

    def __init__(self) -> None:
        self._code: grpc.StatusCode | None = None
        self.ends = 0
        self.messages = 0

    def _begin(self, conn: _Link, block: bytes, body: bytes | None) -> None:
        raise AssertionError("a probe is started by the test")

    def _on_stream(self, stream: _Stream) -> None:
        pass

    def _message(self, data: bytes) -> None:
        self.messages += 1

    def _again(self) -> bool:
        return False

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        self.ends += 1
        self._code = code


def _reply(sid: int, status: bytes, bodies: list[bytes]) -> bytes:
    encoder = hpack.Encoder()
    head = encoder.encode([(b":status", status), (b"content-type", b"application/grpc")])
    tail = encoder.encode([(b"grpc-status", b"0"), (b"grpc-message", b"ok%20then")])
    data = b"".join(b"\0" + len(b).to_bytes(4, "big") + b for b in bodies)
    return h2(HEADERS, 4, sid, head) + h2(DATA, 0, sid, data) + h2(HEADERS, 5, sid, tail)


_sid = st.sampled_from([1, 3])
_PIECES = st.one_of(
    st.builds(
        _reply,
        _sid,
        st.sampled_from([b"200", b"404", b"x"]),
        st.lists(st.binary(max_size=40), max_size=3),
    ),
    st.just(h2(SETTINGS, 0, 0, struct.pack(">HIHI", 4, 1000, 3, 1))),
    st.builds(lambda p: h2(PING, 0, 0, p), st.binary(min_size=8, max_size=8)),
    st.builds(
        lambda sid, n: h2(WINDOW_UPDATE, 0, sid, struct.pack(">I", n)),
        st.sampled_from([0, 1, 3]),
        st.integers(1, 2**31 - 1),
    ),
    st.builds(
        lambda sid, c: h2(RST_STREAM, 0, sid, struct.pack(">I", c)), _sid, st.integers(0, 13)
    ),
    st.builds(lambda last: h2(GOAWAY, 0, 0, struct.pack(">II", last, 0)), st.integers(0, 5)),
)


async def _feed(data: bytes, cut: int) -> None:
    conn = _Connection(Channel("127.0.0.1", 1, spawn=lambda *_: None))  # no timer runs
    transport = _Transport()
    conn.connection_made(transport)
    probes = [_Probe(), _Probe()]
    for probe in probes:
        conn.start(probe, b"\x88", None)  # streams 1 and 3
    try:
        for chunk in (data[:cut], data[cut:]):
            conn.data_received(chunk)  # never raises
            assert conn._frames.buffered <= 9 + MAX_FRAME + MAX_HEADER_BLOCK
            if conn.error is not None:
                assert transport.aborted
                assert conn.error.code() == grpc.StatusCode.UNAVAILABLE
                break
    finally:
        conn.close(conn.error or _closed())
    assert all(probe.ends == 1 for probe in probes)


def _closed() -> Any:
    from coord.backends.etcd._grpc import RpcError

    return RpcError(grpc.StatusCode.UNAVAILABLE, "the test is done")


@FUZZ
@given(
    st.lists(_PIECES, min_size=1, max_size=8),
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 255), st.sampled_from("fid")), max_size=4
    ),
    st.integers(0, 5000),
)
def test_the_connection_acts_on_bytes_or_drops_itself(
    pieces: list[bytes], mutations: list[tuple[int, int, str]], cut: int
) -> None:
    data = mutated(b"".join(pieces), mutations)
    asyncio.run(_feed(data, cut % (len(data) + 1)))


@FUZZ
@given(st.binary(max_size=2000), st.integers(0, 2000))
def test_the_connection_survives_random_bytes(data: bytes, cut: int) -> None:
    asyncio.run(_feed(data, cut % (len(data) + 1)))
