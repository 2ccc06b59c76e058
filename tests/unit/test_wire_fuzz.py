"""Property-based fuzzing (hypothesis) of the ZooKeeper wire client's parsing, which does
no I/O: the frame buffer, the ConnectResponse, and the replies and watch events of a
connection, over random and mutated byte streams. Whatever the bytes, only the
documented error comes out (:class:`ProtocolError`, on which the connection is dropped),
buffered bytes stay under the frame cap, and each example runs within its deadline.

A fixed budget, the same on every run: derandomized, no example database.
"""

from __future__ import annotations

import itertools
import struct
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.protocol.serialization import (
    Create2,
    Delete,
    Exists,
    GetChildren,
    GetChildren2,
    GetData,
    SetData,
    Sync,
)

from coord.backends.zookeeper._wire import ProtocolError
from coord.backends.zookeeper._wire._framing import FrameBuffer, decode_connect
from coord.backends.zookeeper._wire._records import CreateContainer, Multi
from coord.backends.zookeeper._wire._replies import Replies
from coord.backends.zookeeper._wire._watches import Arming, Kind, Watches

from ._zk_script import PASSWORD, STAT

if TYPE_CHECKING:
    from kazoo.protocol.states import WatchedEvent

FUZZ = settings(
    max_examples=300,
    deadline=timedelta(milliseconds=500),
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
MAX_FRAME = 64  # a small cap, so that random lengths hit both sides of it


def _frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def _string(text: bytes) -> bytes:
    return struct.pack("!i", len(text)) + text


#: 32-bit values at the edges: a length of -1 is kazoo's null string (drawn more
#: often), the others are lengths and counts past any frame.
_EDGES = [-1, -1, -1, 0, 1, 2**31 - 1, -(2**31), 2**16]
#: Where a 32-bit field is set: a record's lengths and counts come first in its body,
#: just after the reply header (16 bytes).
_FIELDS_WITHIN = 48


@st.composite
def _mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """*valid* with a byte changed, a 32-bit field set to an edge value (lengths and
    counts are 32-bit fields, mostly at a multiple of 4), cut short, or with random
    bytes inserted."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["byte", "int", "int", "cut", "insert"]))
        if kind == "int":
            at = draw(st.integers(0, min(len(data), _FIELDS_WITHIN) // 4)) * 4
        else:
            at = draw(st.integers(0, len(data)))
        if kind == "byte" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "int":
            data[at : at + 4] = struct.pack("!i", draw(st.sampled_from(_EDGES)))
        elif kind == "cut":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(max_size=8))
    return bytes(data)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _feed_all(buffer: FrameBuffer, chunks: list[bytes]) -> list[bytes]:
    """Every frame the chunks make, checking the bounds after each feed; stops at the
    first ProtocolError (the connection would be dropped)."""
    frames: list[bytes] = []
    for chunk in chunks:
        try:
            got = buffer.feed(chunk)
        except ProtocolError:
            return frames
        assert all(len(frame) <= MAX_FRAME for frame in got)
        assert len(buffer) < 4 + MAX_FRAME  # an incomplete frame, at most
        frames.extend(got)
    return frames


# -- the frame buffer -------------------------------------------------------------------

_PAYLOADS = st.lists(st.binary(max_size=MAX_FRAME), max_size=8)
_CUTS = st.lists(st.integers(0, 2**16), max_size=16)


@FUZZ
@given(payloads=_PAYLOADS, cuts=_CUTS)
def test_valid_frames_come_out_whole_from_any_chunking(
    payloads: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(_frame(p) for p in payloads)
    buffer = FrameBuffer(max_frame=MAX_FRAME)
    assert _feed_all(buffer, _chunks(stream, cuts)) == payloads
    assert len(buffer) == 0


@FUZZ
@given(data=st.binary(max_size=512), cuts=_CUTS)
def test_random_bytes_give_frames_under_the_cap_or_a_protocol_error(
    data: bytes, cuts: list[int]
) -> None:
    _feed_all(FrameBuffer(max_frame=MAX_FRAME), _chunks(data, cuts))


@FUZZ
@given(data=st.data(), payloads=_PAYLOADS, cuts=_CUTS)
def test_mutated_streams_give_frames_under_the_cap_or_a_protocol_error(
    data: st.DataObject, payloads: list[bytes], cuts: list[int]
) -> None:
    stream = data.draw(_mutated(b"".join(_frame(p) for p in payloads)))
    _feed_all(FrameBuffer(max_frame=MAX_FRAME), _chunks(stream, cuts))


# -- the ConnectResponse ----------------------------------------------------------------

_CONNECT = struct.pack("!iiqi", 0, 3000, 0x1234, 16) + PASSWORD + b"\0"


@FUZZ
@given(data=st.data())
def test_a_connect_response_decodes_or_is_a_protocol_error(data: st.DataObject) -> None:
    frame = data.draw(st.one_of(st.binary(max_size=64), _mutated(_CONNECT)))
    try:
        reply = decode_connect(frame)
    except ProtocolError:
        return
    assert isinstance(reply.passwd, bytes)
    assert all(isinstance(v, int) for v in (reply.time_out, reply.session_id))


# -- replies and watch events -------------------------------------------------------------

_STAT = bytes(STAT)
#: A request, and the body of a valid answer to it (mutated by the tests).
_ANSWERS: list[tuple[Any, bytes]] = [
    (GetData("/app/a", False), _string(b"data") + _STAT),
    (Exists("/app/a", True), _STAT),
    (GetChildren("/app", True), struct.pack("!i", 2) + _string(b"a") + _string(b"b")),
    (GetChildren2("/app", False), struct.pack("!i", 1) + _string(b"a") + _STAT),
    (Create2("/app/c", b"", [], 0), _string(b"/app/c") + _STAT),
    (CreateContainer("/app/d", b"", [], 4), _string(b"/app/d") + _STAT),
    (SetData("/app/a", b"x", -1), _STAT),
    (Delete("/app/a", -1), b""),
    (Sync("/app"), _string(b"/app")),
    (
        Multi([Create2("/app/e", b"", [], 0), Delete("/app/a", -1)]),
        struct.pack("!iBi", 15, 0, 0)
        + _string(b"/app/e")
        + _STAT
        + struct.pack("!iBi", 2, 0, 0)
        + struct.pack("!iBi", -1, 1, -1),
    ),
]
_INT = struct.Struct("!i")
_EDGE = st.sampled_from(_EDGES).map(_INT.pack)
#: A string field: a valid one, or a length at an edge (null, past the frame).
_STRING = st.one_of(st.binary(max_size=8).map(_string), _EDGE)
_STAT_FIELD = st.one_of(st.just(_STAT), st.binary(max_size=80))


@st.composite
def _strings(draw: st.DrawFn) -> bytes:
    """A list of strings: a count (valid, or at an edge) and that many string fields."""
    items = draw(st.lists(_STRING, max_size=3))
    count = draw(st.one_of(st.just(_INT.pack(len(items))), _EDGE))
    return count + b"".join(items)


@st.composite
def _multi_results(draw: st.DrawFn) -> bytes:
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        opcode = draw(st.sampled_from([1, 2, 5, 13, 15, 19, -1, 99]))
        parts.append(struct.pack("!iBi", opcode, 0, -1) + draw(_STRING) + draw(_STAT_FIELD))
    return b"".join(parts) + struct.pack("!iBi", -1, draw(st.sampled_from([1, 0])), -1)


#: The fields of each request's answer (by its record's class), valid or at an edge.
_FIELDS: dict[type, st.SearchStrategy[bytes]] = {
    GetData: st.tuples(_STRING, _STAT_FIELD).map(b"".join),
    Exists: _STAT_FIELD,
    GetChildren: _strings(),
    GetChildren2: st.tuples(_strings(), _STAT_FIELD).map(b"".join),
    Create2: st.tuples(_STRING, _STAT_FIELD).map(b"".join),
    CreateContainer: st.tuples(_STRING, _STAT_FIELD).map(b"".join),
    SetData: _STAT_FIELD,
    Delete: st.just(b""),
    Sync: _STRING,
    Multi: _multi_results(),
}
_WATCH_EVENT = st.tuples(
    st.sampled_from([1, 2, 3, 4, -1, 99]).map(_INT.pack), st.just(_INT.pack(3)), _STRING
).map(b"".join)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[WatchedEvent] = []

    def __call__(self, event: WatchedEvent) -> None:
        self.events.append(event)


@st.composite
def _incoming(draw: st.DrawFn, xid: int, request: Any) -> bytes:
    """A frame from the server: an answer to request *xid* (its fields valid or at an
    edge), a watch event, an auth answer, an error answer, or random bytes; each
    possibly mutated further."""
    header = struct.Struct("!iqi")
    valid = draw(
        st.one_of(
            _FIELDS[type(request)].map(lambda body: header.pack(xid, 7, 0) + body),
            _WATCH_EVENT.map(lambda body: header.pack(-1, -1, 0) + body),
            st.sampled_from([0, -115]).map(lambda err: header.pack(-4, 0, err)),
            st.integers(-130, 0).map(lambda err: header.pack(xid, 7, err)),
        )
    )
    return draw(st.one_of(st.just(valid), _mutated(valid), st.binary(max_size=64)))


@FUZZ
@given(data=st.data(), answer=st.sampled_from(range(len(_ANSWERS))))
def test_a_reply_settles_its_request_or_is_a_protocol_error(
    data: st.DataObject, answer: int
) -> None:
    """Each frame either settles what it answers (a value, or kazoo's error for its
    code), fires a watch, or raises ProtocolError: never another exception, and never
    a value holding None where a path or a name must be."""
    request, _ = _ANSWERS[answer]
    recorder = _Recorder()
    watches = Watches(lambda path: path.removeprefix("/app") or "/")
    watches.arm(Arming("/app/a", Kind.DATA, recorder))
    replies = Replies(watches, last_zxid=0)
    sent = replies.in_flight.add(request, Arming("/app", Kind.CHILD, recorder))
    auth = replies.expect_auth()
    frames = data.draw(st.lists(_incoming(sent.xid, request), min_size=1, max_size=4))
    for frame in frames:
        try:
            replies.dispatch(frame)
        except ProtocolError:
            break
    if sent.reply.resolved and sent.reply._error is None:
        value = sent.reply._value
        assert value is None or not _null_where_a_name_goes(value, request)
    assert all(isinstance(event.path, str) for event in recorder.events)
    assert not auth.resolved or isinstance(auth._value, bool)


def _null_where_a_name_goes(value: Any, request: Any) -> bool:
    if isinstance(request, GetData):
        return False  # a node's data may be null
    if isinstance(value, list | tuple):
        return any(_null_where_a_name_goes(item, request) for item in value)
    return value is None


@pytest.mark.parametrize(("request_", "body"), _ANSWERS, ids=lambda r: type(r).__name__)
def test_the_valid_answers_decode(request_: Any, body: bytes) -> None:
    """The fuzz starts from answers that decode (else it would test only refusals)."""
    replies = Replies(Watches(lambda path: path), last_zxid=0)
    sent = replies.in_flight.add(request_)
    replies.dispatch(struct.pack("!iqi", sent.xid, 7, 0) + body)
    assert sent.reply.resolved
    assert sent.reply._error is None
    assert replies.last_zxid == 7
