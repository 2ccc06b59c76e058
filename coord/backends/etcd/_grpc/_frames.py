"""HTTP/2 frames (RFC 9113, section 4 and 6): cut from the bytes a server sends and
checked, with no I/O and no connection state beyond a header block being assembled.

Why a module of its own (h2's ``frame_buffer.py``, coord's ``zookeeper/_wire/_framing.py``):
every rule a frame must follow on its own is checked here, before the connection acts on
it, so a hostile or broken server's bytes end in one :class:`ProtocolError` (the
connection is dropped, its calls fail as UNAVAILABLE) and never in a raw ``ValueError``,
unbounded memory or a hang. What needs the connection's state (which streams are open,
the flow-control windows, the PING in flight) is checked by the connection.

The checks here: a frame is no longer than the SETTINGS_MAX_FRAME_SIZE we advertised (the
default, 16 KiB: we never raise it), so at most one frame is buffered; each frame type's
length, stream id and padding; SETTINGS' length (a multiple of 6) and values' ranges; a
WINDOW_UPDATE's increment of 0; a header block split over CONTINUATION frames is capped
(:data:`MAX_HEADER_BLOCK`, the "CONTINUATION flood" of 2024) and not interrupted; PUSH_PROMISE
is refused (we disable push).
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "ACK",
    "CONTINUATION",
    "DATA",
    "DEFAULT_WINDOW",
    "END_HEADERS",
    "END_STREAM",
    "GOAWAY",
    "HEADERS",
    "MAX_FRAME",
    "MAX_HEADER_BLOCK",
    "MAX_WINDOW",
    "PADDED",
    "PING",
    "RST_STREAM",
    "SETTINGS",
    "SETTING_ENABLE_PUSH",
    "SETTING_HEADER_TABLE_SIZE",
    "SETTING_INITIAL_WINDOW",
    "SETTING_MAX_CONCURRENT",
    "SETTING_MAX_FRAME",
    "SETTING_MAX_HEADER_LIST",
    "WINDOW_UPDATE",
    "FrameBuffer",
    "ProtocolError",
    "frame",
]

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTING_HEADER_TABLE_SIZE, SETTING_ENABLE_PUSH, SETTING_MAX_CONCURRENT = 1, 2, 3
SETTING_INITIAL_WINDOW, SETTING_MAX_FRAME, SETTING_MAX_HEADER_LIST = 4, 5, 6

#: The largest frame payload we accept: SETTINGS_MAX_FRAME_SIZE's default, which we never
#: raise (RFC 9113, 4.2: a larger frame is a FRAME_SIZE_ERROR). It also bounds what one
#: frame buffers.
MAX_FRAME: Final = 16_384
#: The largest frame payload a peer may allow us (RFC 9113, 6.5.2).
_MAX_FRAME_LIMIT: Final = 2**24 - 1
#: The largest flow-control window (RFC 9113, 6.9.1).
MAX_WINDOW: Final = 2**31 - 1
DEFAULT_WINDOW: Final = 65_535
#: The largest header block (HEADERS and its CONTINUATION frames, HPACK-coded) we
#: assemble; we advertise it as SETTINGS_MAX_HEADER_LIST_SIZE too. etcd's are a few
#: hundred bytes; h2 and nghttp2 cap theirs likewise (the "CONTINUATION flood").
MAX_HEADER_BLOCK: Final = 65_536

_HEADER = struct.Struct(">IBBI")
#: A frame's header as read: its length in two parts (24 bits), type, flags, stream id.
_HEAD = struct.Struct(">BHBBI")
#: Flags that take a DATA or HEADERS frame off the fast path of :meth:`FrameBuffer.feed`.
_OFF_FAST_PATH = PADDED | PRIORITY_FLAG


class ProtocolError(Exception):
    """The server broke HTTP/2's rules: the connection must be dropped (a connection
    error, RFC 9113, 5.4.1)."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header, then *payload*."""
    return _HEADER.pack(len(payload), kind, flags, stream_id)[1:] + payload


class FrameBuffer:
    """The frames in a server's bytes, each checked on its own (see the module).

    :meth:`feed` takes what was read and returns the whole frames it completed as
    ``(kind, flags, stream_id, payload)``, padding and priority fields removed (but a DATA
    frame's padding, checked, is left: it counts for flow control); a header
    block comes whole, as one HEADERS frame with END_HEADERS, once its last CONTINUATION
    arrived. PRIORITY and frames of unknown types are checked or skipped (RFC 9113, 5.5),
    not returned. What remains buffered is less than one frame.
    """

    __slots__ = ("_block", "_block_flags", "_block_stream", "_buffer")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._block: bytearray | None = None  # a header block awaiting CONTINUATION
        self._block_stream = 0
        self._block_flags = 0

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """The whole frames that *data* completes, in order.

        :raises ProtocolError: at the first frame that breaks a rule (the connection is
            then unusable: the frames before it are not returned, nothing stays buffered)
        """
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            view = data  # the usual case: no copy of what came whole
        pos, size = 0, len(view)
        frames: list[tuple[int, int, int, bytes]] = []
        try:
            while size - pos >= 9:
                high, low, kind, flags, sid = _HEAD.unpack_from(view, pos)
                length = high << 16 | low
                if length > MAX_FRAME:
                    raise ProtocolError(f"a frame of {length:,} bytes (at most {MAX_FRAME:,})")
                end = pos + 9 + length
                if end > size:
                    break
                sid &= 0x7FFFFFFF
                payload = bytes(view[pos + 9 : end])
                pos = end
                if sid and self._block is None and not flags & _OFF_FAST_PATH and kind <= HEADERS:
                    # DATA, or a whole header block, unpadded: most frames, nothing to check.
                    if kind == DATA or flags & END_HEADERS:
                        frames.append((kind, flags, sid, payload))
                        continue
                checked = self._checked(kind, flags, sid, payload)
                if checked is not None:
                    frames.append(checked)
        except ProtocolError:
            buffer.clear()  # unusable now: hold nothing more
            self._block = None
            raise
        if view is buffer:
            del buffer[:pos]
        elif pos < size:
            buffer += view[pos:]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held: of a partial frame and of a header block being assembled."""
        return len(self._buffer) + (len(self._block) if self._block is not None else 0)

    def _checked(
        self, kind: int, flags: int, sid: int, payload: bytes
    ) -> tuple[int, int, int, bytes] | None:
        if self._block is not None and kind != CONTINUATION:
            raise ProtocolError("a header block was interrupted by another frame")
        if kind == DATA:
            _on_stream(kind, sid)
            _unpadded(flags, payload)  # checked; removed by the connection, after
            return kind, flags, sid, payload  # counting it for flow control (RFC 9113, 6.1)
        if kind == HEADERS:
            return self._headers(flags, sid, payload)
        if kind == CONTINUATION:
            return self._continuation(flags, sid, payload)
        check = _CHECKS.get(kind)
        if check is not None:
            check(flags, sid, payload)
            return None if kind == PRIORITY else (kind, flags, sid, payload)
        return None  # an unknown type: ignored (RFC 9113, 5.5)

    def _headers(self, flags: int, sid: int, payload: bytes) -> tuple[int, int, int, bytes] | None:
        _on_stream(HEADERS, sid)
        block = _unpadded(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolError("a HEADERS frame too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            return HEADERS, flags, sid, block
        self._block = bytearray(block)
        self._block_stream = sid
        self._block_flags = flags | END_HEADERS
        return None

    def _continuation(
        self, flags: int, sid: int, payload: bytes
    ) -> tuple[int, int, int, bytes] | None:
        block = self._block
        if block is None or sid != self._block_stream:
            raise ProtocolError("a CONTINUATION frame that continues no header block")
        if len(block) + len(payload) > MAX_HEADER_BLOCK:
            raise ProtocolError(f"a header block over {MAX_HEADER_BLOCK:,} bytes")
        block += payload
        if not flags & END_HEADERS:
            return None
        self._block = None
        return HEADERS, self._block_flags, sid, bytes(block)


def _on_stream(kind: int, sid: int) -> None:
    if sid == 0:
        raise ProtocolError(f"a frame of type {kind} on stream 0")


def _unpadded(flags: int, payload: bytes) -> bytes:
    """*payload* without its padding (RFC 9113, 6.1): a pad length that leaves no room
    for the pad-length byte itself and the padding is a PROTOCOL_ERROR."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("a frame's padding is longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def _length(kind: str, payload: bytes, length: int) -> None:
    if len(payload) != length:
        raise ProtocolError(f"a {kind} frame of {len(payload)} bytes (not {length})")


def _on_connection(kind: str, sid: int) -> None:
    if sid != 0:
        raise ProtocolError(f"a {kind} frame on stream {sid} (only on the connection)")


def _priority(flags: int, sid: int, payload: bytes) -> None:
    _on_stream(PRIORITY, sid)
    _length("PRIORITY", payload, 5)


def _rst_stream(flags: int, sid: int, payload: bytes) -> None:
    _on_stream(RST_STREAM, sid)
    _length("RST_STREAM", payload, 4)


def _settings(flags: int, sid: int, payload: bytes) -> None:
    """RFC 9113, 6.5 and 6.5.2: the frame's shape and each known setting's range."""
    _on_connection("SETTINGS", sid)
    if flags & ACK:
        _length("SETTINGS acknowledgement", payload, 0)
        return
    if len(payload) % 6:
        raise ProtocolError(f"a SETTINGS frame of {len(payload)} bytes (not a multiple of 6)")
    for key, value in struct.iter_unpack(">HI", payload):
        if key == SETTING_ENABLE_PUSH and value != 0:
            raise ProtocolError(f"a server's SETTINGS_ENABLE_PUSH of {value} (must be 0)")
        if key == SETTING_INITIAL_WINDOW and value > MAX_WINDOW:
            raise ProtocolError(f"a SETTINGS_INITIAL_WINDOW_SIZE of {value:,} (over 2^31-1)")
        if key == SETTING_MAX_FRAME and not MAX_FRAME <= value <= _MAX_FRAME_LIMIT:
            raise ProtocolError(f"a SETTINGS_MAX_FRAME_SIZE of {value:,} (not 2^14..2^24-1)")


def _push_promise(flags: int, sid: int, payload: bytes) -> None:
    raise ProtocolError("a PUSH_PROMISE, though push is disabled")


def _ping(flags: int, sid: int, payload: bytes) -> None:
    _on_connection("PING", sid)
    _length("PING", payload, 8)


def _goaway(flags: int, sid: int, payload: bytes) -> None:
    _on_connection("GOAWAY", sid)
    if len(payload) < 8:
        raise ProtocolError(f"a GOAWAY frame of {len(payload)} bytes (at least 8)")


def _window_update(flags: int, sid: int, payload: bytes) -> None:
    _length("WINDOW_UPDATE", payload, 4)
    if not int.from_bytes(payload, "big") & 0x7FFFFFFF:
        raise ProtocolError("a WINDOW_UPDATE of 0")


_CHECKS = {
    PRIORITY: _priority,
    RST_STREAM: _rst_stream,
    SETTINGS: _settings,
    PUSH_PROMISE: _push_promise,
    PING: _ping,
    GOAWAY: _goaway,
    WINDOW_UPDATE: _window_update,
}
