"""What one HTTP/2 connection of the etcd transport receives: the server's frames, come
checked from :mod:`._frames` (no I/O), acted on here with what needs the connection's
state checked too: frames on streams it never opened, windows past 2^31-1, PING
acknowledgements it did not ask for. Any break of the rules is a connection error: the
connection is dropped and its calls fail as UNAVAILABLE, as for a lost connection.
Replies go to the calls as whole gRPC messages; header blocks are decoded with HPACK.
"""

from __future__ import annotations

import struct
from collections import deque

import grpc
import hpack

from ._frames import (
    ACK,
    DATA,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    RST_STREAM,
    SETTING_INITIAL_WINDOW,
    SETTING_MAX_CONCURRENT,
    SETTING_MAX_FRAME,
    SETTINGS,
    WINDOW_UPDATE,
    FrameBuffer,
    ProtocolError,
    frame,
)
from ._link import _CANCEL, _REFUSED_STREAM, Dialer, _Link, _Stream, _unblock
from ._status import CODES, HTTP_CODES, RESET_CODES, UNAVAILABLE, percent_decoded

__all__ = ["_Connection"]

#: Header blocks a connection keeps decoded, at most (see ``_Connection._fields``).
_DECODED = 32


class _Connection(_Link):
    """One HTTP/2 connection: what :class:`_Link` sends, and the frames received."""

    def __init__(self, channel: Dialer) -> None:
        super().__init__(channel)
        self._frames = FrameBuffer()
        self._decoder = hpack.Decoder()
        # Header blocks decoded with the table as it is: etcd's replies repeat the same
        # few blocks (indexed fields), and decoding them is a third of a reply's cost.
        self._decoded: dict[bytes, dict[bytes, bytes]] = {}

    # -- receiving ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            for kind, flags, sid, payload in self._frames.feed(data):
                if kind == DATA:
                    self._data(sid, flags, payload)
                elif kind == HEADERS:
                    self._header_block(sid, payload, bool(flags & END_STREAM))
                elif kind == RST_STREAM:
                    self._reset_by_peer(sid, payload)
                elif kind == SETTINGS:
                    self._settings(flags, payload)
                elif kind == PING:
                    self._pinged(flags, payload)
                elif kind == GOAWAY:
                    self._goaway(payload)
                elif kind == WINDOW_UPDATE:
                    self._window_update(sid, payload)
                if self.error is not None:
                    return
        except (ProtocolError, hpack.HPACKError, ValueError) as exc:
            self.abort(f"etcd sent what HTTP/2 does not allow: {exc}")
        finally:
            if self._to_answer and self.error is None:
                self._send_answers()

    def _stream(self, sid: int) -> _Stream | None:
        """The open stream *sid*, or None if it is closed (its frames are ignored: RFC
        9113, 5.1, lets them arrive after we reset it).

        :raises ProtocolError: if *sid* is one we never opened: an even one (the server's,
            and we disabled push) or one past the last we opened (idle)
        """
        stream = self._streams.get(sid)
        if stream is None and (not sid & 1 or sid >= self._next_id):
            raise ProtocolError(f"a frame on stream {sid}, which the client never opened")
        return stream

    def _data(self, sid: int, flags: int, payload: bytes) -> None:
        stream = self._streams.get(sid)
        size = len(payload)  # padding counts for flow control (RFC 9113, 6.1)
        self._grant(size)
        if stream is None:
            self._stream(sid)  # never opened: refused; else reset by us: ignored, but
            return  # its data still counts for the connection's window
        stream.window -= size
        if stream.window < 0:  # RFC 9113, 6.9.1: it held back nothing of what it sent
            raise ProtocolError(f"DATA past the flow-control window of stream {sid}")
        if flags & PADDED:  # its length was checked (the frame buffer)
            payload = payload[1 : size - payload[0]]
        held = self._messages(stream, payload)
        if held < 0:
            return  # the stream ended (a message refused)
        stream.unacked += size - held
        if stream.unacked >= self._half_window:
            self.credit(stream, 0)
        if flags & END_STREAM:
            # No trailers: gRPC always sends them; a server that does not is not gRPC.
            self._end_stream(stream, grpc.StatusCode.INTERNAL, "the stream ended without a status")

    def _messages(self, stream: _Stream, payload: bytes) -> int:
        """Hand the whole gRPC messages in *stream*'s data so far to its call: the bytes
        its call holds until its reader takes them (a stream's replies; a unary call's
        reply is taken at once), or -1 if a message was refused (the stream ended)."""
        received = stream.received
        received += payload
        limit = self._channel.max_receive
        holds = stream.call.holds_replies
        held = 0
        while True:
            if not stream.message:
                if len(received) < 5:
                    break
                if received[0]:
                    self._end_stream(stream, grpc.StatusCode.INTERNAL, "a compressed message")
                    return -1
                stream.message = int.from_bytes(received[1:5], "big") + 5
                if stream.message - 5 > limit:
                    self._end_stream(
                        stream,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"a message of {stream.message - 5:,} bytes (at most {limit:,})",
                    )
                    return -1
            if len(received) < stream.message:
                break
            message = bytes(received[5 : stream.message])
            del received[: stream.message]
            if holds:
                held += stream.message
            stream.message = 0
            stream.call._message(message)
        return held

    def _fields(self, block: bytes) -> dict[bytes, bytes]:
        """The fields of the header block *block*, decoded always (the dynamic table must
        follow every block), but for a block that decoded the same way from the same
        table: one that left the table as it was, while it still is."""
        fields = self._decoded.get(block)
        if fields is not None:
            return fields
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        fields = dict(self._decoder.decode(block, raw=True))
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if after[0] != before[0] or after[1] is not before[1] or after[2] != before[2]:
            self._decoded.clear()  # decoded with another table: stale
        elif len(self._decoded) < _DECODED:
            self._decoded[block] = fields
        return fields

    def _header_block(self, sid: int, block: bytes, end: bool) -> None:
        fields = self._fields(block)  # first: the dynamic table follows every block
        stream = self._streams.get(sid) or self._stream(sid)
        if stream is None:
            return
        if not stream.headers_seen:
            stream.headers_seen = True
            status = fields.get(b":status")
            if status != b"200":
                code = HTTP_CODES.get(int(status or 0), grpc.StatusCode.UNKNOWN)
                self._end_stream(stream, code, f"HTTP status {status!r} from etcd")
                return
        if not end:
            return
        code = fields.get(b"grpc-status")
        if code is None:
            self._end_stream(stream, grpc.StatusCode.INTERNAL, "the trailers have no grpc-status")
            return
        details = fields.get(b"grpc-message", b"")
        self._end_stream(
            stream,
            CODES.get(int(code), grpc.StatusCode.UNKNOWN),
            percent_decoded(details) if details else "",
        )

    def _end_stream(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        if self._streams.pop(stream.id, None) is None:
            return
        self._blocked.pop(stream, None)
        _unblock(stream)
        if not stream.ended_local and self._pipe is not None:
            # Ended by the server before we were done sending: tell it we stop too.
            self._pipe.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", _CANCEL)))
        stream.call._ended(code, details)
        self._drained()

    def _reset_by_peer(self, sid: int, payload: bytes) -> None:
        if self._stream(sid) is None:
            return
        stream = self._streams.pop(sid)
        self._blocked.pop(stream, None)
        _unblock(stream)
        error = int.from_bytes(payload[:4], "big")
        if error == _REFUSED_STREAM and stream.call._again():
            self._drained()
            return  # never processed: it goes again (on this connection or the next)
        code = RESET_CODES.get(error, grpc.StatusCode.INTERNAL)
        stream.call._ended(code, f"etcd reset the stream (HTTP/2 error {error})")
        self._drained()

    def _settings(self, flags: int, payload: bytes) -> None:
        assert self._pipe is not None
        if flags & ACK:
            return
        for key, value in struct.iter_unpack(">HI", payload):  # ranges checked (frames)
            if key == SETTING_INITIAL_WINDOW:
                delta = value - self._initial_window
                self._initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:  # RFC 9113, 6.9.2
                        raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE overflows a window")
            elif key == SETTING_MAX_FRAME:
                self._max_frame = value
            elif key == SETTING_MAX_CONCURRENT:
                self._max_streams = value
                self._start_queued()
        self._answer(frame(SETTINGS, ACK, 0))
        if self._blocked and self.error is None:
            self._flush()

    def _pinged(self, flags: int, payload: bytes) -> None:
        assert self._pipe is not None
        if not flags & ACK:
            self._answer(frame(PING, ACK, 0, payload))
            return
        if self._ping_due is None or payload != self._ping_sent:
            # An answer to a PING we did not send (RFC 9113, 6.7: it must echo ours): a
            # server that acknowledges what it never received cannot be trusted to be live.
            raise ProtocolError("a PING acknowledgement for a PING never sent")
        if self._ping_due is not None:
            self._ping_due.cancel()
            self._ping_due = None
            self._schedule_ping()

    def _goaway(self, payload: bytes) -> None:
        last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        self.draining = True
        self._channel._lost(self)
        queued, self._queued = self._queued, deque()
        for call, block, body in queued:  # never sent: on the next connection
            self._channel._wait(call, block, body)
        for sid in [sid for sid in self._streams if sid > last]:
            # Never processed: safe to repeat elsewhere.
            self._end_stream(self._streams[sid], UNAVAILABLE, "etcd is going away (GOAWAY)")
        self._drained()

    def _window_update(self, sid: int, payload: bytes) -> None:
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF  # not 0 (frames)
        if sid == 0:
            self._send_window += increment
            window = self._send_window
        else:
            stream = self._stream(sid)
            if stream is None:
                return
            stream.send_window += increment
            window = stream.send_window
        if window > MAX_WINDOW:  # RFC 9113, 6.9.1
            raise ProtocolError(f"a WINDOW_UPDATE past 2^31-1 on stream {sid}")
        if self._blocked:
            self._flush()
