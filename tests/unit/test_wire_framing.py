"""The wire client's pieces that need no server: framing, xid order, the watch tables,
and the records kazoo's codec lacks."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import pytest
from kazoo import exceptions as kz
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    GetChildren2,
    GetData,
    SetData,
    Transaction,
    stat_struct,
)
from kazoo.protocol.states import EventType, KeeperState

from coord.backends.zookeeper._wire import MultiFailed, ProtocolError, Watcher
from coord.backends.zookeeper._wire._errors import error_for
from coord.backends.zookeeper._wire._framing import (
    FrameBuffer,
    encode,
    encode_request,
    reply_header,
)
from coord.backends.zookeeper._wire._pending import InFlight, Reply
from coord.backends.zookeeper._wire._records import (
    SET_WATCHES_MAX_BYTES,
    Multi,
    SetWatches,
    children2,
    set_watches_batches,
)
from coord.backends.zookeeper._wire._watches import Arming, Kind, Watches

if TYPE_CHECKING:
    from kazoo.protocol.states import WatchedEvent


def frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


# -- framing ----------------------------------------------------------------------------


def test_frames_cut_from_any_chunking() -> None:
    payloads = [b"", b"a", b"hello world" * 100, bytes(range(256))]
    stream = b"".join(frame(p) for p in payloads)
    for size in (1, 3, 7, 1000, len(stream)):
        buffer, got = FrameBuffer(), []
        for i in range(0, len(stream), size):
            got.extend(buffer.feed(stream[i : i + size]))
        assert got == payloads
        assert len(buffer) == 0


def test_an_incomplete_frame_waits_for_the_rest() -> None:
    buffer = FrameBuffer()
    assert buffer.feed(frame(b"one") + frame(b"two")[:5]) == [b"one"]
    assert len(buffer) == 5
    assert buffer.feed(frame(b"two")[5:]) == [b"two"]


@pytest.mark.parametrize("length", [-1, 1025])
def test_a_length_out_of_range_is_a_protocol_error(length: int) -> None:
    buffer = FrameBuffer(max_frame=1024)
    with pytest.raises(ProtocolError, match="not a ZooKeeper stream"):
        buffer.feed(struct.pack("!i", length) + b"x")


def test_request_packets() -> None:
    assert encode(7, 4, b"body") == struct.pack("!iii", 12, 7, 4) + b"body"
    packet = encode_request(3, GetData("/a", True))
    length, xid, opcode = struct.unpack_from("!iii", packet)
    assert (length, xid, opcode) == (len(packet) - 4, 3, GetData.type)
    assert packet[12:] == GetData("/a", True).serialize()


def test_reply_headers() -> None:
    assert reply_header(struct.pack("!iqi", 5, 2**40, -101) + b"rest") == (5, 2**40, -101)
    with pytest.raises(ProtocolError, match="no header"):
        reply_header(b"short")


# -- xid order --------------------------------------------------------------------------


def test_replies_are_matched_in_order() -> None:
    in_flight = InFlight()
    sent = [in_flight.add(f"request {i}") for i in range(3)]
    assert [s.xid for s in sent] == [1, 2, 3]
    assert in_flight.pop(1) is sent[0]
    with pytest.raises(ProtocolError, match="out of order: xid 3, 2 expected"):
        in_flight.pop(3)
    assert in_flight.pop(2) is sent[1]
    assert in_flight.pop(3) is sent[2]
    with pytest.raises(ProtocolError, match="to no request"):
        in_flight.pop(4)


def test_xids_wrap_before_the_reserved_negative_ones() -> None:
    in_flight = InFlight()
    in_flight._xid = 2**31 - 2
    assert [in_flight.add(None).xid for _ in range(3)] == [2**31 - 1, 1, 2]


async def test_a_lost_connection_fails_each_request_with_its_own_error() -> None:
    in_flight = InFlight()
    replies = [in_flight.add(None).reply for _ in range(2)]
    in_flight.fail_all(kz.ConnectionLoss)
    assert len(in_flight) == 0
    errors = []
    for reply in replies:
        with pytest.raises(kz.ConnectionLoss) as caught:
            await reply.wait()
        errors.append(caught.value)
    assert errors[0] is not errors[1]  # (a shared instance would share its traceback)


async def test_a_reply_is_resolved_once() -> None:
    reply = Reply()
    reply.resolve("first")
    reply.resolve(error=RuntimeError("later"))
    assert reply.resolved
    assert await reply.wait() == "first"


# -- watches ----------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[WatchedEvent] = []

    def __call__(self, event: WatchedEvent) -> None:
        self.events.append(event)


def test_watches_fire_once_by_kind() -> None:
    watches = Watches(lambda path: path.removeprefix("/root") or "/")
    data, exist, child = Recorder(), Recorder(), Recorder()
    watches.arm(Arming("/root/a", Kind.DATA, data))
    watches.arm(Arming("/root/a", Kind.DATA, exist), exists=False)
    watches.arm(Arming("/root/a", Kind.CHILD, child))
    assert watches.paths() == (["/root/a"], ["/root/a"], ["/root/a"])
    watches.fire(4, "/root/a")  # children changed: the child watch only
    assert child.events == [(EventType.CHILD, KeeperState.CONNECTED, "/a")]
    watches.fire(3, "/root/a")  # data changed: the data and exist watches
    assert data.events == [(EventType.CHANGED, KeeperState.CONNECTED, "/a")]
    assert exist.events == data.events
    watches.fire(2, "/root/a")  # nothing left to fire
    assert len(data.events) == len(exist.events) == len(child.events) == 1
    assert len(watches) == 0


def test_a_delete_fires_every_kind_and_a_callback_once_per_event() -> None:
    watches = Watches(lambda path: path)
    recorder = Recorder()
    for kind in (Kind.DATA, Kind.CHILD):
        watches.arm(Arming("/a", kind, recorder))
    watches.fire(2, "/a")
    assert recorder.events == [(EventType.DELETED, KeeperState.CONNECTED, "/a")]
    watches.fire(99, "/a")  # an event kind we do not know: ignored


def test_session_end_fires_every_watch_and_a_broken_callback_stops_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watches = Watches(lambda path: path)

    def broken(event: WatchedEvent) -> None:
        raise RuntimeError("broken callback")

    watcher = Watcher()
    watches.arm(Arming("/a", Kind.DATA, broken))
    watches.arm(Arming("/b", Kind.CHILD, watcher))
    watches.fire_all(KeeperState.EXPIRED_SESSION)
    assert watcher.event == (EventType.NONE, KeeperState.EXPIRED_SESSION, "/b")
    assert "watch callback failed" in caplog.text
    assert len(watches) == 0


# -- records ----------------------------------------------------------------------------


def _strings(data: bytes, offset: int) -> tuple[list[str], int]:
    (count,) = struct.unpack_from("!i", data, offset)
    offset += 4
    out = []
    for _ in range(count):
        (length,) = struct.unpack_from("!i", data, offset)
        out.append(data[offset + 4 : offset + 4 + length].decode())
        offset += 4 + length
    return out, offset


def test_set_watches_layout() -> None:
    body = SetWatches(42, ["/d"], ["/e1", "/e2"], []).serialize()
    assert struct.unpack_from("!q", body)[0] == 42
    data, offset = _strings(body, 8)
    exist, offset = _strings(body, offset)
    child, offset = _strings(body, offset)
    assert (data, exist, child, offset) == (["/d"], ["/e1", "/e2"], [], len(body))


def test_set_watches_are_split_under_the_size_bound() -> None:
    paths = [f"/{i:05d}" + "x" * 1000 for i in range(400)]
    batches = list(set_watches_batches(7, paths, [], paths[:10]))
    assert len(batches) > 1
    assert all(len(b.serialize()) < SET_WATCHES_MAX_BYTES + 2048 for b in batches)
    assert [p for b in batches for p in b.data] == paths
    assert [p for b in batches for p in b.child] == paths[:10]
    assert {b.relative_zxid for b in batches} == {7}
    assert list(set_watches_batches(7, [], [], [])) == []


def test_multi_encodes_like_kazoo() -> None:
    ops = [
        Create("/a", b"x", [], 0),
        Delete("/b", 3),
        SetData("/c", b"y", -1),
        CheckVersion("/d", 1),
    ]
    assert Multi(ops).serialize() == bytes(Transaction(ops).serialize())


def _stat(czxid: int) -> bytes:
    return bytes(stat_struct.pack(czxid, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))


def _result(opcode: int, body: bytes = b"", err: int = 0) -> bytes:
    return struct.pack("!iBi", opcode, 0, err) + body


def _string(text: str) -> bytes:
    return struct.pack("!i", len(text)) + text.encode()


def test_multi_answers_are_decoded() -> None:
    answer = (
        _result(1, _string("/a"))
        + _result(15, _string("/b") + _stat(9))
        + _result(19, _string("/c") + _stat(10))
        + _result(2)
        + _result(5, _stat(11))
        + _result(13)
        + struct.pack("!iBi", -1, 1, -1)
    )
    results: list[Any] = Multi.deserialize(b"head" + answer, 4)
    assert results[0] == "/a"
    assert [(p, s.czxid) for p, s in results[1:3]] == [("/b", 9), ("/c", 10)]
    assert results[3] is True
    assert results[4].czxid == 11
    assert results[5] is True


def test_a_failed_multi_names_the_operation() -> None:
    answer = (
        _result(-1, struct.pack("!i", 0))
        + _result(-1, struct.pack("!i", kz.BadVersionError.code))
        + _result(-1, struct.pack("!i", -2))
        + struct.pack("!iBi", -1, 1, -1)
    )
    failed = MultiFailed(Multi.deserialize(answer, 0))
    assert (failed.index, type(failed.error)) == (1, kz.BadVersionError)
    assert [type(r) for r in failed.results] == [
        kz.RolledBackError,
        kz.BadVersionError,
        kz.RuntimeInconsistency,
    ]
    assert "operation 1 failed: BadVersionError" in str(failed)


def test_error_codes() -> None:
    assert isinstance(error_for(kz.NoNodeError.code), kz.NoNodeError)
    unknown = error_for(-12345)
    assert isinstance(unknown, kz.ZookeeperError)
    assert "-12345" in str(unknown)


def _children_answer(names: list[bytes], stat: tuple[int, ...]) -> bytes:
    body = struct.pack(">i", len(names))
    for name in names:
        body += struct.pack(">i", len(name)) + name
    return body + bytes(stat_struct.pack(*stat))


_STAT = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)


@pytest.mark.parametrize(
    "names",
    [
        [],
        [b"@a-0000000001"],
        [b"@a-0000000002", b"@b-0000000001", b"@c-0000000003"],  # one length: one pass
        [b"@a-0000000002", b"@bb-0000000001", b"@c-0000000003"],  # one longer
        [b"@a-0000000002", b"@b-0000000001", b"@cc-0000000003"],  # the last longer
        [b"\xc3\xa9t\xc3\xa9", b"abcdef"],  # one length in bytes, not in characters
        [b"x", b""],
        [b"", b""],
    ],
)
def test_children2_decodes_as_kazoo_does(names: list[bytes]) -> None:
    """A queue's listing is decoded in one pass when its names have one length (see
    _records.children2); any listing gives what kazoo's GetChildren2 gives."""
    frame = b"\0" * 7 + _children_answer(names, _STAT)
    assert children2(frame, 7) == GetChildren2.deserialize(frame, 7)
    assert children2(frame, 7)[0] == [n.decode() for n in names]


def test_children2_of_a_short_frame_fails_as_kazoo_does() -> None:
    frame = _children_answer([b"@a-0000000001", b"@b-0000000002"], _STAT)
    with pytest.raises(struct.error):
        children2(frame[:-3], 0)
