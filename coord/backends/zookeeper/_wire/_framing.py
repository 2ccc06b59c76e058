"""ZooKeeper's framing: length-prefixed packets, request and reply headers.

Every packet, both ways, is a 4-byte big-endian length followed by that many bytes.

* The client's first packet is the ConnectRequest, with no header; the server's first
  is the ConnectResponse, with no header either.
* Every later request starts with ``xid:int32, opcode:int32``; every later reply with
  ``xid:int32, zxid:int64, err:int32`` and then the body (only when ``err`` is 0).
* The server answers a connection's requests in the order they were sent, so replies are
  matched by position and the xid only checks it. A few xids are not requests' and
  arrive out of that order: :data:`WATCH_XID` (a watch event), :data:`PING_XID`,
  :data:`AUTH_XID` and :data:`SET_WATCHES_XID` (their answers).
"""

from __future__ import annotations

import struct
from typing import Any, Final

from kazoo.protocol.serialization import Connect

from ._errors import ProtocolError

__all__ = [
    "AUTH_XID",
    "DECODE_ERRORS",
    "MAX_FRAME",
    "PING_XID",
    "REPLY_HEADER_SIZE",
    "SET_WATCHES_XID",
    "WATCH_XID",
    "FrameBuffer",
    "decode_connect",
    "encode",
    "encode_connect",
    "encode_request",
    "reply_header",
]

WATCH_XID: Final = -1
PING_XID: Final = -2
AUTH_XID: Final = -4
SET_WATCHES_XID: Final = -8

#: The longest frame accepted from a server. ZooKeeper's own limit (``jute.maxbuffer``)
#: is 1 MiB by default and configurable; a "length" far beyond it is a stream that lost
#: its framing (or is not ZooKeeper), which is dropped instead of buffered.
MAX_FRAME: Final = 64 * 1024 * 1024

_LENGTH = struct.Struct("!i")
#: What kazoo's codec raises on a record that does not decode.
DECODE_ERRORS = (struct.error, ValueError, IndexError, UnicodeDecodeError, TypeError)
_REQUEST_HEADER = struct.Struct("!iii")  # length, xid, opcode
_REPLY_HEADER = struct.Struct("!iqi")  # xid, zxid, err
REPLY_HEADER_SIZE: Final = _REPLY_HEADER.size


def encode(xid: int, opcode: int, body: bytes | bytearray) -> bytes:
    """One request packet: length, header and *body*."""
    return _REQUEST_HEADER.pack(len(body) + 8, xid, opcode) + body


def encode_request(xid: int, request: Any) -> bytes:
    """The packet of a kazoo ``serialization`` record (``type`` is its opcode)."""
    return encode(xid, request.type, request.serialize())


def encode_connect(connect: Any) -> bytes:
    """The packet of a ConnectRequest (kazoo's ``Connect``): no request header."""
    body = bytes(connect.serialize())
    return _LENGTH.pack(len(body)) + body


def decode_connect(frame: bytes) -> Any:
    """The ConnectResponse in the server's first frame (kazoo's ``Connect``). Its
    timeout is the session's to judge (:mod:`._session`).

    :raises ProtocolError: if the frame is not one (short, or without a password)
    """
    try:
        reply, _ = Connect.deserialize(frame, 0)
    except DECODE_ERRORS as exc:
        raise ProtocolError("the server's answer is not a ConnectResponse") from exc
    if not isinstance(reply.passwd, bytes):
        raise ProtocolError("a ConnectResponse without a session password")
    return reply


def reply_header(frame: bytes) -> tuple[int, int, int]:
    """``(xid, zxid, err)`` of a reply frame; its body starts at :data:`REPLY_HEADER_SIZE`.

    :raises ProtocolError: if the frame is too short to hold a header
    """
    if len(frame) < REPLY_HEADER_SIZE:
        raise ProtocolError(f"a reply of {len(frame)} bytes has no header")
    xid, zxid, err = _REPLY_HEADER.unpack_from(frame)
    return xid, zxid, err


class FrameBuffer:
    """Cuts frames out of the bytes received so far (no I/O: the reader feeds it).

    Example::

        frames = buffer.feed(await stream.receive())  # zero, one or many frames
    """

    __slots__ = ("_buffer", "_max_frame")

    def __init__(self, *, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def __len__(self) -> int:
        """How many bytes are buffered (of frames not yet complete)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add *data*; return every frame it completes, in order (without their length).

        :raises ProtocolError: on a negative length or one above ``max_frame``
        """
        buffer = self._buffer
        buffer += data
        frames = []
        start, end = 0, len(buffer)
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(buffer, start)
            if not 0 <= length <= self._max_frame:
                raise ProtocolError(f"a frame of length {length}: not a ZooKeeper stream")
            stop = start + 4 + length
            if stop > end:
                break
            frames.append(bytes(buffer[start + 4 : stop]))
            start = stop
        del buffer[:start]
        return frames
