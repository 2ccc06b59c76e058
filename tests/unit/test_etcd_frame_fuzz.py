"""Property-based fuzzing (hypothesis) of the etcd transport's frame parser
(``coord/backends/etcd/_grpc/_frames.py``), which does no I/O: over random bytes and over
well-formed frame streams mutated, cut anywhere, it returns frames or raises
:class:`ProtocolError`, nothing else; it holds less than one frame and one capped header
block; and a well-formed stream comes back frame for frame however it is cut.

A fixed, deterministic budget (``derandomize``, no example database) keeps it in the
normal suite."""

from __future__ import annotations

import itertools
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coord.backends.etcd._grpc._frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    MAX_HEADER_BLOCK,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    FrameBuffer,
    ProtocolError,
    frame,
)

from ._h2_script import mutated

FUZZ = settings(
    max_examples=300,
    deadline=1000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_stream_id = st.integers(1, 2**31 - 1)
_payload = st.binary(max_size=64)

#: Well-formed frames: (what is sent, what the parser returns for it).
_FRAMES = st.one_of(
    st.builds(lambda sid, p: (DATA, 0, sid, p), _stream_id, _payload),
    st.builds(lambda sid, p: (HEADERS, END_HEADERS, sid, p), _stream_id, _payload),
    st.builds(lambda p: (PING, 0, 0, p), st.binary(min_size=8, max_size=8)),
    st.builds(
        lambda sid, c: (RST_STREAM, 0, sid, struct.pack(">I", c)), _stream_id, st.integers(0, 13)
    ),
    st.builds(
        lambda items: (SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in items)),
        st.lists(st.tuples(st.sampled_from([1, 3, 6, 9]), st.integers(0, 2**32 - 1)), max_size=4),
    ),
    st.builds(
        lambda sid, n: (WINDOW_UPDATE, 0, sid, struct.pack(">I", n)),
        st.integers(0, 9),
        st.integers(1, 2**31 - 1),
    ),
    st.builds(lambda p: (GOAWAY, 0, 0, p), st.binary(min_size=8, max_size=24)),
)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _feed_all(chunks: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    """Feed *chunks*: the frames, or ProtocolError; and the buffer stays bounded."""
    buffer = FrameBuffer()
    frames = []
    for chunk in chunks:
        frames += buffer.feed(chunk)
        assert buffer.buffered < 9 + MAX_FRAME + MAX_HEADER_BLOCK
        for _, _, sid, payload in frames:
            assert len(payload) <= MAX_HEADER_BLOCK
            assert 0 <= sid < 2**31
    return frames


@FUZZ
@given(st.lists(st.binary(max_size=512), max_size=16))
def test_random_bytes_give_frames_or_a_protocol_error(chunks: list[bytes]) -> None:
    started = time.monotonic()
    try:
        _feed_all(chunks)
    except ProtocolError:
        pass
    assert time.monotonic() - started < 0.5


@FUZZ
@given(st.lists(_FRAMES, max_size=12), st.lists(st.integers(0, 10_000), max_size=8))
def test_well_formed_frames_come_back_however_they_are_cut(
    frames: list[tuple[int, int, int, bytes]], cuts: list[int]
) -> None:
    data = b"".join(frame(*f) for f in frames)
    assert _feed_all(_cut(data, cuts)) == frames


@FUZZ
@given(
    st.lists(_FRAMES, min_size=1, max_size=12),
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from("fid")),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.integers(0, 10_000), max_size=8),
)
def test_mutated_frames_give_frames_or_a_protocol_error(
    frames: list[tuple[int, int, int, bytes]],
    mutations: list[tuple[int, int, str]],
    cuts: list[int],
) -> None:
    """Bytes flipped, inserted or deleted anywhere (headers, lengths, flags, ids)."""
    data = mutated(b"".join(frame(*f) for f in frames), mutations)
    try:
        _feed_all(_cut(data, cuts))
    except ProtocolError:
        pass


@FUZZ
@given(st.integers(0, 2**24 - 1), st.integers(0, 255), st.integers(0, 255), st.binary(max_size=32))
def test_a_frame_header_alone_never_buffers_past_one_frame(
    length: int, kind: int, flags: int, rest: bytes
) -> None:
    """Any length a header states: over the advertised maximum it is refused at once,
    before its payload arrives; under it, at most that much is held."""
    header = length.to_bytes(3, "big") + bytes((kind, flags)) + b"\0\0\0\1"
    buffer = FrameBuffer()
    if length > MAX_FRAME:
        with pytest.raises(ProtocolError, match="frame of"):
            buffer.feed(header)
        return
    try:
        buffer.feed(header + rest)
    except ProtocolError:
        return
    assert buffer.buffered <= 9 + MAX_FRAME


def test_a_continuation_flood_is_cut_at_the_cap() -> None:
    buffer = FrameBuffer()
    buffer.feed(frame(HEADERS, 0, 1, b"\x88"))
    chunk = frame(CONTINUATION, 0, 1, b"\x88" * MAX_FRAME)
    with pytest.raises(ProtocolError, match="header block over"):
        for _ in range(MAX_HEADER_BLOCK // MAX_FRAME + 1):
            buffer.feed(chunk)
    assert buffer.buffered == 0  # refused: nothing held


def test_a_header_block_comes_whole_after_its_continuations() -> None:
    buffer = FrameBuffer()
    assert buffer.feed(frame(HEADERS, 0x1, 3, b"ab") + frame(CONTINUATION, 0, 3, b"cd")) == []
    assert buffer.feed(frame(CONTINUATION, END_HEADERS, 3, b"ef")) == [
        (HEADERS, 0x1 | END_HEADERS, 3, b"abcdef")
    ]
    with pytest.raises(ProtocolError, match="interrupted"):
        buffer.feed(frame(HEADERS, 0, 5, b"a") + frame(DATA, 0, 5, b""))
