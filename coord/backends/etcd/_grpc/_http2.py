"""gRPC over HTTP/2 on a connection of our own: the part of ``grpc.aio`` that the etcd
backend uses (unary calls and bidirectional streams), on an asyncio protocol.

Why not grpc.aio: a call there costs a task, gRPC's C core with its threads and
completion queue, and a poller thread waking the event loop, several times this
transport's client CPU per call; a contended acquisition makes about three unary calls
and two stream writes (``docs/design/etcd-transport.md``, ``docs/benchmarks.md``).

What it speaks: the HTTP/2 framing of RFC 9113 that a gRPC client needs (HEADERS and
CONTINUATION, DATA, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, with flow control
both ways), HPACK (RFC 7541: requests as literals without indexing, so the encoder keeps
no state; responses decoded with the ``hpack`` package) and gRPC's length-prefixed
messages and status trailers. TLS (ALPN ``h2``) comes from :mod:`ssl`. The server's
bytes are cut into frames and checked by :mod:`._frames` (no I/O); what needs the
connection's state (stream ids, windows, the PING in flight) is checked here. Any break of
the rules is a connection error: the connection is dropped, its calls fail as UNAVAILABLE.

Its calls look like grpc.aio's to their users (aetcd's generated stubs make them through
:meth:`Channel.unary_unary` and :meth:`Channel.stream_stream`): a unary call is awaited
for its reply; a stream is written, read (:data:`EOF` at its end) and cancelled; a
failure raises :class:`RpcError`, a ``grpc.aio.AioRpcError`` with the status code.

A channel connects on its first call and again after the connection is lost; calls made
while it connects wait for it (a failed attempt fails them as UNAVAILABLE, and calls in
the next moment fail at once, as gRPC's do in its transient failure). While streams are
open it pings the server every *keepalive* seconds and drops a connection whose ping is
not answered in time: a paused or partitioned member fails its calls instead of hanging.
Writes wait while the transport is paused (its buffer full: the server does not read);
answers to a flood of PING or SETTINGS frames are refused (:data:`_MAX_ANSWERS`), and a
connection on which nothing can be sent for *stall_timeout* is dropped (see
``_Connection._hold``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any

import grpc
import hpack

from ._frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME,
    MAX_HEADER_BLOCK,
    MAX_WINDOW,
    PADDED,
    PING,
    RST_STREAM,
    SETTING_ENABLE_PUSH,
    SETTING_HEADER_TABLE_SIZE,
    SETTING_INITIAL_WINDOW,
    SETTING_MAX_CONCURRENT,
    SETTING_MAX_FRAME,
    SETTING_MAX_HEADER_LIST,
    SETTINGS,
    WINDOW_UPDATE,
    FrameBuffer,
    ProtocolError,
    frame,
)

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

__all__ = ["EOF", "Channel", "RpcError", "StreamCall", "UnaryCall"]

_log = logging.getLogger("coord.backends.etcd")

#: What a stream's read returns at its end (grpc.aio's own marker).
EOF = grpc.aio.EOF

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_REFUSED_STREAM = 7
_CANCEL = 8
#: The largest flow-control window (RFC 9113, 6.9.1): what we grant, so the server never
#: waits for us; topped up once a sixteenth of it was received.
_WINDOW = MAX_WINDOW
_TOP_UP = 2**27
_DEFAULT_FRAME = MAX_FRAME
_MAX_STREAM_ID = 2**31 - 1
#: Seconds a closing channel waits for its connections' transports to close.
_CLOSE_WAIT = 0.5
#: Times a unary call goes again after the server refused its stream unprocessed.
_REFUSALS = 3
#: Header blocks a connection keeps decoded, at most (see ``_Connection._fields``).
_DECODED = 32
#: Frames that demand an answer (PING, SETTINGS) a connection answers in one read, or
#: while its transport is paused (the peer does not read what we write), at most: one
#: more is a flood (the "ping flood" and "settings flood" of CVE-2019-9512 and -9515), and
#: the connection is dropped. Every answer must be written (RFC 9113, 6.5.3 and 6.7), and
#: one the peer does not read waits in our buffer: unbounded, a peer that sends and never
#: reads grew the client by megabytes a second, and answering a read's worth of them
#: (256 KiB: 28,000 empty SETTINGS) held the event loop for tens of milliseconds each
#: time. A real peer sends one now and then (a keepalive, or a bandwidth probe, which
#: waits for its answer before the next). nghttp2 closes a session retaining more than
#: 1,000 such answers (``max_outbound_ack``); Go's HTTP/2 server, at 10,000 queued
#: control frames of every kind.
_MAX_ANSWERS = 1000
#: RST_STREAM error codes -> gRPC codes (gRPC's HTTP/2 transport mapping).
_RESET_CODES = {
    7: grpc.StatusCode.UNAVAILABLE,  # REFUSED_STREAM: not processed, safe to repeat
    8: grpc.StatusCode.CANCELLED,
    11: grpc.StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    12: grpc.StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}
#: HTTP statuses of a response that is not gRPC's -> gRPC codes (gRPC's mapping).
_HTTP_CODES = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_OK = grpc.StatusCode.OK
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class RpcError(grpc.aio.AioRpcError):  # type: ignore[misc]
    """A call's failure: its gRPC status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def _string(value: bytes) -> bytes:
    """An HPACK string literal, not Huffman-coded (RFC 7541, 5.2)."""
    n = len(value)
    if n < 127:
        return bytes((n,)) + value
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out) + value


def _literal(name_index: int, value: bytes) -> bytes:
    """A header field without indexing, its name from the static table (index < 15)."""
    return bytes((name_index,)) + _string(value)


def _literal_named(name: bytes, value: bytes) -> bytes:
    """A header field without indexing, with a new name."""
    return b"\x00" + _string(name) + _string(value)


def _grpc_message(data: bytes) -> bytes:
    """One message as gRPC frames it: uncompressed, its length, itself."""
    return struct.pack(">BI", 0, len(data)) + data


class _Stream:
    """One HTTP/2 stream of a connection: what it sends and what it received."""

    __slots__ = (
        "call",
        "ended_local",
        "headers_seen",
        "id",
        "message",
        "pending",
        "received",
        "send_window",
        "unacked",
    )

    def __init__(self, call: _Call, send_window: int) -> None:
        self.call = call
        self.id = 0
        self.send_window = send_window
        self.pending: deque[tuple[bytes, bool, asyncio.Future[None] | None]] = deque()
        self.received = bytearray()  # gRPC framing: a message may span DATA frames
        self.message = 0  # the length of the message being received, 0 if none
        self.unacked = 0  # bytes received since we last granted them back
        self.headers_seen = False
        self.ended_local = False


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection: frames in and out, streams, flow control, keepalive."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._transport: asyncio.Transport | None = None
        self._frames = FrameBuffer()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._decoder = hpack.Decoder()
        # Header blocks decoded with the table as it is: etcd's replies repeat the same
        # few blocks (indexed fields), and decoding them is a third of a reply's cost.
        self._decoded: dict[bytes, dict[bytes, bytes]] = {}
        self._send_window = DEFAULT_WINDOW
        self._initial_window = DEFAULT_WINDOW  # each new stream's, as the server says
        self._max_frame = _DEFAULT_FRAME
        self._max_streams = 2**31
        self._queued: deque[tuple[_Call, bytes, bytes | None]] = deque()  # over the limit
        self._blocked: dict[_Stream, None] = {}  # streams with data waiting for window
        self._unacked = 0
        self._paused = False  # the transport's buffer is full: writes wait (see below)
        self._answers = 0  # PING and SETTINGS answered while paused
        self._to_answer: list[bytes] = []  # answers to the frames being read, in order
        self._held_since: float | None = None  # see _hold
        self._stall: asyncio.TimerHandle | None = None
        self._ping: asyncio.TimerHandle | None = None
        self._ping_due: asyncio.TimerHandle | None = None
        self._pings = 0
        self._ping_sent = b""  # the payload of the PING in flight (see _pinged)
        self.error: RpcError | None = None  # set once the connection is lost
        self.draining = False  # GOAWAY received: no new streams
        #: Resolved when the transport is closed (a TLS one says goodbye first).
        self.shut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        settings = struct.pack(
            ">HIHIHIHI",
            SETTING_ENABLE_PUSH,
            0,
            SETTING_INITIAL_WINDOW,
            _WINDOW,
            SETTING_HEADER_TABLE_SIZE,
            4096,
            SETTING_MAX_HEADER_LIST,
            MAX_HEADER_BLOCK,
        )
        transport.write(
            _PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", _WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"the connection to etcd was lost: {exc}" if exc else "etcd closed the connection"
        self._fail(RpcError(_UNAVAILABLE, reason))
        if not self.shut.done():
            self.shut.set_result(None)

    def _fail(self, error: RpcError) -> None:
        if self.error is None:
            self.error = error
        for timer in (self._ping, self._ping_due, self._stall):
            if timer is not None:
                timer.cancel()
        self._ping = self._ping_due = self._stall = None
        streams, self._streams = self._streams, {}
        self._blocked.clear()
        for stream in streams.values():
            _unblock(stream)
            stream.call._ended(error.code(), error.details() or "")
        queued, self._queued = self._queued, deque()
        for call, _, _ in queued:
            call._ended(error.code(), error.details() or "")
        self._channel._lost(self, gone=True)

    def close(self, error: RpcError) -> None:
        """End every call with *error* and close the connection."""
        self._fail(error)
        if self._transport is not None:
            self._transport.close()

    def abort(self, why: str) -> None:
        self._fail(RpcError(_UNAVAILABLE, why))
        if self._transport is not None:
            self._transport.abort()

    @property
    def usable(self) -> bool:
        return self.error is None and not self.draining and self._next_id < _MAX_STREAM_ID

    # -- sending -------------------------------------------------------------------------------

    def start(self, call: _Call, block: bytes, body: bytes | None) -> None:
        """Open a stream for *call* with the header block *block*, and send *body* as its
        whole request if there is one (a unary call's: one write for both frames); once
        fewer streams are open than the server allows (``call._on_stream`` tells)."""
        if self._paused or len(self._streams) >= self._max_streams or self._queued:
            self._queued.append((call, block, body))
            self._hold()
            return
        call._on_stream(self._open_stream(call, block, body))

    def _start_queued(self) -> None:
        started = False
        while (
            self._queued
            and len(self._streams) < self._max_streams
            and not self._paused
            and self.error is None
        ):
            call, block, body = self._queued.popleft()
            if call._code is None:  # not ended while it waited
                call._on_stream(self._open_stream(call, block, body))
                started = True
        if started:
            self._progressed()

    def _open_stream(self, call: _Call, block: bytes, body: bytes | None) -> _Stream:
        assert self._transport is not None
        stream = _Stream(call, self._initial_window)
        stream.id = sid = self._next_id
        self._next_id += 2
        self._streams[sid] = stream
        if len(block) <= self._max_frame:
            headers = frame(HEADERS, END_HEADERS, sid, block)
        else:
            chunks = [block[i : i + self._max_frame] for i in range(0, len(block), self._max_frame)]
            out = [frame(HEADERS, 0, sid, chunks[0])]
            for i, chunk in enumerate(chunks[1:], 2):
                out.append(frame(CONTINUATION, END_HEADERS if i == len(chunks) else 0, sid, chunk))
            headers = b"".join(out)
        if body is not None and len(body) <= min(
            self._send_window, stream.send_window, self._max_frame
        ):
            self._send_window -= len(body)
            stream.send_window -= len(body)
            stream.ended_local = True
            self._transport.write(headers + frame(DATA, END_STREAM, sid, body))
            if self._held_since is not None:
                self._progressed()
        else:
            self._transport.write(headers)
            if body is not None:
                self.send(stream, body, end=True)
        if self._ping is None and self._ping_due is None:
            self._schedule_ping()
        return stream

    def send(
        self, stream: _Stream, data: bytes, end: bool, done: asyncio.Future[None] | None = None
    ) -> bool:
        """Send *data* on *stream* (*end*: its last); False if flow control holds some of
        it back, sent later (then *done* is resolved once all of it went out)."""
        if (
            stream.pending
            or self._paused
            or len(data) > min(self._send_window, stream.send_window, self._max_frame)
        ):
            stream.pending.append((data, end, done))
            self._blocked[stream] = None
            self._flush()
            if stream.pending:
                self._hold()
            return not stream.pending
        assert self._transport is not None
        self._send_window -= len(data)
        stream.send_window -= len(data)
        self._transport.write(frame(DATA, END_STREAM if end else 0, stream.id, data))
        stream.ended_local = stream.ended_local or end
        if self._held_since is not None:
            self._progressed()
        return True

    def _flush(self) -> None:
        """Send what flow control held back, as far as the windows allow and until the
        transport pauses us."""
        assert self._transport is not None
        sent = False
        for stream in list(self._blocked):
            while stream.pending and not self._paused:
                data, end, done = stream.pending[0]
                room = min(self._send_window, stream.send_window, self._max_frame)
                if room <= 0 and data:
                    break
                chunk, rest = data[:room], data[room:]
                self._send_window -= len(chunk)
                stream.send_window -= len(chunk)
                last = end and not rest
                self._transport.write(frame(DATA, END_STREAM if last else 0, stream.id, chunk))
                sent = True
                if rest:
                    stream.pending[0] = (rest, end, done)
                    continue
                stream.pending.popleft()
                stream.ended_local = stream.ended_local or end
                if done is not None and not done.done():
                    done.set_result(None)
            if not stream.pending:
                del self._blocked[stream]
        if sent:
            self._progressed()

    def reset(self, stream: _Stream) -> None:
        """Cancel *stream* (RST_STREAM CANCEL); its call has ended already."""
        if self._streams.pop(stream.id, None) is None:
            return
        self._blocked.pop(stream, None)
        _unblock(stream)
        if self._transport is not None and self.error is None:
            self._transport.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", _CANCEL)))
        self._drained()

    def _drained(self) -> None:
        """A stream ended: start one that waited for room, or close a connection that
        is going away once it has none left."""
        if self._queued:
            self._start_queued()
        if self.draining and not self._streams:
            self.close(RpcError(_UNAVAILABLE, "etcd is going away (GOAWAY)"))

    # -- backpressure ---------------------------------------------------------------------------

    def pause_writing(self) -> None:
        """The transport's buffer is over its high-water mark (the peer reads slower than
        we write): what the calls send waits (held back as for flow control, new streams
        queued) until :meth:`resume_writing`; the answers the peer demands meanwhile are
        bounded (:meth:`_answer`)."""
        self._paused = True
        self._answers = 0

    def resume_writing(self) -> None:
        self._paused = False
        self._answers = 0
        if self.error is None:
            if self._blocked:
                self._flush()
            if self._queued:
                self._start_queued()

    def _answer(self, frame: bytes) -> None:
        """Answer the peer (a PING's or a SETTINGS' ACK) once the frames at hand are
        read (:meth:`_send_answers`: one write for all, not a system call each); or drop
        the connection if it asked for more than :data:`_MAX_ANSWERS` in this read, or
        while it does not read."""
        self._to_answer.append(frame)
        if len(self._to_answer) + (self._answers if self._paused else 0) > _MAX_ANSWERS:
            self.abort(
                f"etcd sent over {_MAX_ANSWERS} PING or SETTINGS frames at once or "
                "without reading their answers (a flood)"
            )

    def _send_answers(self) -> None:
        answers, self._to_answer = self._to_answer, []
        if self._paused:
            self._answers += len(answers)
        assert self._transport is not None
        self._transport.write(b"".join(answers) if len(answers) > 1 else answers[0])

    # What the calls send can wait on the server: for its flow-control windows (a DATA
    # frame held back), for room under its limit of streams (a stream queued), or for it
    # to read (our transport paused). RFC 9113 lets a server hold any of them back, and
    # to set every stream's initial window to 0, but one that never lets anything out
    # while it answers our PINGs would keep the connection "alive" and every call on it
    # timing out, for good with a single endpoint (a failover is the only other way out).
    # So a connection on which something waits to be sent while nothing at all goes out
    # (no DATA frame written, no waiting stream opened) for ``stall_timeout`` seconds is
    # dropped like a lost one: its calls fail as UNAVAILABLE and the next connection serves
    # them. The clock runs from the first hold without progress since, across calls that
    # gave up meanwhile (each attempt of a retried call is held back anew, for less than
    # the timeout each time), and only progress stops it: a server that lets one call's
    # data out shows its connection works, even if it holds another stream back (that one
    # is the server's application pushing back, which is its right).

    def _hold(self) -> None:
        """Something waits to be sent: start the stall clock, unless it runs."""
        if self._held_since is None:
            self._held_since = asyncio.get_running_loop().time()
        if self._stall is None and self.error is None:
            loop = asyncio.get_running_loop()
            due = self._held_since + self._channel.stall_timeout
            self._stall = loop.call_at(due, self._check_stall)

    def _progressed(self) -> None:
        """Something held back went out: the clock starts again for what still waits."""
        held = self._blocked or self._queued
        self._held_since = asyncio.get_running_loop().time() if held else None

    def _check_stall(self) -> None:
        self._stall = None
        if self._held_since is None or self.error is not None:
            return
        loop = asyncio.get_running_loop()
        due = self._held_since + self._channel.stall_timeout
        if loop.time() < due:
            self._stall = loop.call_at(due, self._check_stall)
            return
        if self._blocked or any(call._code is None for call, _, _ in self._queued):
            timeout = self._channel.stall_timeout
            self.abort(f"nothing could be sent to etcd for {timeout:g} s (flow control)")
        # else nobody waits now: the next hold finds the clock past due, and drops it.

    # -- keepalive ------------------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        loop = asyncio.get_running_loop()
        self._ping = loop.call_later(self._channel.keepalive, self._send_ping)

    def _send_ping(self) -> None:
        self._ping = None
        if self.error is not None or not self._streams:
            return  # nothing waits on this connection: ping when something does
        assert self._transport is not None
        self._pings += 1
        self._ping_sent = self._pings.to_bytes(8, "big")
        self._transport.write(frame(PING, 0, 0, self._ping_sent))
        loop = asyncio.get_running_loop()
        self._ping_due = loop.call_later(self._channel.keepalive_timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        self._ping_due = None
        self.abort(f"etcd did not answer a ping within {self._channel.keepalive_timeout:g} s")

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

    def _grant(self, stream: _Stream | None, n: int) -> None:
        """Give back *n* bytes of flow-control window once a share was used."""
        assert self._transport is not None
        self._unacked += n
        if self._unacked >= _TOP_UP:
            self._transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unacked)))
            self._unacked = 0
        if stream is not None:
            stream.unacked += n
            if stream.unacked >= _TOP_UP:
                self._transport.write(
                    frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", stream.unacked))
                )
                stream.unacked = 0

    def _data(self, sid: int, flags: int, payload: bytes) -> None:
        stream = self._stream(sid)
        self._grant(stream, len(payload))  # padding counts for flow control (RFC 9113, 6.1)
        if flags & PADDED:  # its length was checked (the frame buffer)
            payload = payload[1 : len(payload) - payload[0]]
        if stream is None:
            return  # reset by us: its data still counts for the connection's window
        received = stream.received
        received += payload
        limit = self._channel.max_receive
        while True:
            if not stream.message:
                if len(received) < 5:
                    break
                if received[0]:
                    self._end_stream(stream, grpc.StatusCode.INTERNAL, "a compressed message")
                    return
                stream.message = int.from_bytes(received[1:5], "big") + 5
                if stream.message - 5 > limit:
                    self._end_stream(
                        stream,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"a message of {stream.message - 5:,} bytes (at most {limit:,})",
                    )
                    return
            if len(received) < stream.message:
                break
            message = bytes(received[5 : stream.message])
            del received[: stream.message]
            stream.message = 0
            stream.call._message(message)
        if flags & END_STREAM:
            # No trailers: gRPC always sends them; a server that does not is not gRPC.
            self._end_stream(stream, grpc.StatusCode.INTERNAL, "the stream ended without a status")

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
        stream = self._stream(sid)
        if stream is None:
            return
        if not stream.headers_seen:
            stream.headers_seen = True
            status = fields.get(b":status")
            if status != b"200":
                code = _HTTP_CODES.get(int(status or 0), grpc.StatusCode.UNKNOWN)
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
            _CODES.get(int(code), grpc.StatusCode.UNKNOWN),
            _percent_decoded(details) if details else "",
        )

    def _end_stream(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        if self._streams.pop(stream.id, None) is None:
            return
        self._blocked.pop(stream, None)
        _unblock(stream)
        if not stream.ended_local and self._transport is not None:
            # Ended by the server before we were done sending: tell it we stop too.
            self._transport.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", _CANCEL)))
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
        code = _RESET_CODES.get(error, grpc.StatusCode.INTERNAL)
        stream.call._ended(code, f"etcd reset the stream (HTTP/2 error {error})")
        self._drained()

    def _settings(self, flags: int, payload: bytes) -> None:
        assert self._transport is not None
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
        assert self._transport is not None
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
            self._end_stream(self._streams[sid], _UNAVAILABLE, "etcd is going away (GOAWAY)")
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


def _unblock(stream: _Stream) -> None:
    """Wake the writers of what *stream* held back: it ended (they see that)."""
    for _, _, done in stream.pending:
        if done is not None and not done.done():
            done.set_result(None)
    stream.pending.clear()


def _percent_decoded(value: bytes) -> str:
    """grpc-message is percent-encoded UTF-8."""
    if b"%" not in value:
        return value.decode("utf-8", "replace")
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(value).decode("utf-8", "replace")


# -- calls ---------------------------------------------------------------------------------------


class _Call:
    """What unary and stream calls share: the stream they run on, and how they end."""

    __slots__ = (
        "_begun",
        "_channel",
        "_code",
        "_conn",
        "_details",
        "_ended_future",
        "_stream",
        "cancelled_here",
    )

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._conn: _Connection | None = None
        self._stream: _Stream | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._ended_future: asyncio.Future[None] | None = None
        self._begun: asyncio.Future[None] | None = None  # made by the first started()
        #: Ended by our own cancel() (not by the server, the network or the channel).
        self.cancelled_here = False

    def _open(self, block: bytes, body: bytes | None) -> None:
        """Start the stream now if the channel is connected, else once it is (the
        channel keeps the call until then, and ends it if it cannot connect)."""
        self._channel._wait(self, block, body)

    def _begin(self, conn: _Connection, block: bytes, body: bytes | None) -> None:
        if self._code is not None:
            return  # cancelled (or timed out) while it waited for the connection
        if conn.error is not None:  # lost while we waited for our turn to run
            self._ended(conn.error.code(), conn.error.details() or "")
            return
        if conn.draining:  # going away: on the next connection
            self._channel._wait(self, block, body)
            return
        self._conn = conn
        conn.start(self, block, body)

    def _on_stream(self, stream: _Stream) -> None:
        """The connection opened the call's stream (at once, or once it had room)."""
        self._stream = stream
        self._started()

    def _started(self) -> None:
        if self._begun is not None and not self._begun.done():
            self._begun.set_result(None)

    async def started(self) -> None:
        """Wait until the call's stream is open (the channel connected) or it ended."""
        if self._stream is None and self._code is None:
            if self._begun is None:
                self._begun = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._begun)

    def _message(self, data: bytes) -> None:
        raise NotImplementedError

    def _again(self) -> bool:
        """The server refused the call's stream before processing it (over its limit
        of streams): start it again if that can be done; whether it was."""
        return False

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        if self._code is not None:
            return
        self._code, self._details = code, details
        if self._ended_future is not None and not self._ended_future.done():
            self._ended_future.set_result(None)
        self._started()
        self._finished()

    def _finished(self) -> None:
        """The call has ended (its code is set)."""

    def cancel(self) -> bool:
        """Cancel the call (RST_STREAM): False if it had already ended."""
        if self._code is not None:
            return False
        self.cancelled_here = True
        self._ended(grpc.StatusCode.CANCELLED, "cancelled by the client")
        if self._conn is not None and self._stream is not None:
            self._conn.reset(self._stream)
        return True

    def done(self) -> bool:
        return self._code is not None

    async def code(self) -> grpc.StatusCode:
        """Wait for the call's end; its status code."""
        if self._code is None:
            if self._ended_future is None:
                self._ended_future = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._ended_future)
        assert self._code is not None
        return self._code

    def _error(self) -> RpcError:
        assert self._code is not None
        return RpcError(self._code, self._details)


class UnaryCall(_Call):
    """One request, one reply: await it."""

    __slots__ = ("_deserialize", "_future", "_refused", "_reply", "_request", "_timer")

    def __init__(
        self,
        channel: Channel,
        block: bytes,
        body: bytes,
        deserialize: Callable[[bytes], Any],
        timeout: float | None,
    ) -> None:
        super().__init__(channel)
        self._deserialize = deserialize
        self._request = (block, body)
        self._refused = 0
        self._reply: bytes | None = None
        loop = asyncio.get_running_loop()
        self._future: asyncio.Future[Any] = loop.create_future()
        # Cancelled by its awaiting task's cancellation: then the call is cancelled too.
        self._future.add_done_callback(self._awaited_done)
        self._timer = loop.call_later(timeout, self._expire) if timeout is not None else None
        self._open(block, body)

    def _again(self) -> bool:
        if self._code is not None or self._refused >= _REFUSALS:
            return False
        self._refused += 1
        self._conn = self._stream = None
        self._reply = None
        self._channel._wait(self, *self._request)
        return True

    def _expire(self) -> None:
        self._timer = None
        if self._code is None:
            self._ended(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            if self._conn is not None and self._stream is not None:
                self._conn.reset(self._stream)

    def _awaited_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.cancel()

    def _message(self, data: bytes) -> None:
        if self._reply is None:
            self._reply = data

    def _finished(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        future = self._future
        if future.done():
            return
        if self._code is _OK:
            if self._reply is None:
                future.set_exception(RpcError(grpc.StatusCode.INTERNAL, "no reply"))
                return
            try:
                future.set_result(self._deserialize(self._reply))
            except Exception as exc:  # a reply that does not parse
                future.set_exception(RpcError(grpc.StatusCode.INTERNAL, f"bad reply: {exc}"))
        elif self.cancelled_here:
            future.cancel()
        else:
            future.set_exception(self._error())

    def cancelled(self) -> bool:
        """Whether it ended by our cancellation."""
        return self.cancelled_here

    def add_done_callback(self, callback: Callable[[UnaryCall], None]) -> None:
        self._future.add_done_callback(lambda _: callback(self))

    def __await__(self) -> Any:
        return self._future.__await__()


class StreamCall(_Call):
    """A bidirectional stream: write requests, read replies (:data:`EOF` at its end)."""

    __slots__ = ("_deserialize", "_readable", "_replies", "_serialize")

    def __init__(
        self,
        channel: Channel,
        block: bytes,
        serialize: Callable[[Any], bytes],
        deserialize: Callable[[bytes], Any],
    ) -> None:
        super().__init__(channel)
        self._serialize = serialize
        self._deserialize = deserialize
        self._replies: deque[bytes] = deque()
        self._readable: asyncio.Future[None] | None = None
        self._open(block, None)

    def _message(self, data: bytes) -> None:
        self._replies.append(data)
        self._wake()

    def _finished(self) -> None:
        self._wake()

    def _wake(self) -> None:
        readable = self._readable
        if readable is not None and not readable.done():
            readable.set_result(None)

    async def write(self, request: Any) -> None:
        """Send *request*. Raises ``asyncio.InvalidStateError`` if the call has ended."""
        await self.started()
        if self._code is not None:
            raise asyncio.InvalidStateError("the call has ended")
        assert self._conn is not None
        assert self._stream is not None
        data = _grpc_message(self._serialize(request))
        done = asyncio.get_running_loop().create_future()
        if not self._conn.send(self._stream, data, end=False, done=done):
            await done  # held back by flow control
            if self._code is not None:
                raise asyncio.InvalidStateError("the call ended before the write went out")

    async def read(self) -> Any:
        """The next reply; :data:`EOF` once the server ended the call well."""
        while not self._replies:
            if self._code is not None:
                if self._code is _OK:
                    return EOF
                if self.cancelled_here:
                    raise asyncio.CancelledError
                raise self._error()
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        return self._deserialize(self._replies.popleft())


# -- the channel ---------------------------------------------------------------------------------


class _Method:
    """One method of a stub (what ``channel.unary_unary(...)`` returns), called per call."""

    __slots__ = ("_channel", "_deserialize", "_path", "_serialize")

    def __init__(self, channel: Channel, path: str, serialize: Any, deserialize: Any) -> None:
        self._channel = channel
        self._path = path.encode()
        self._serialize = serialize
        self._deserialize = deserialize


class _UnaryMethod(_Method):
    __slots__ = ()

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> UnaryCall:
        block = self._channel._block(self._path, metadata)
        body = _grpc_message(self._serialize(request))
        return UnaryCall(self._channel, block, body, self._deserialize, timeout)


class _StreamMethod(_Method):
    __slots__ = ()

    def __call__(self, *, metadata: Sequence[tuple[str, str]] | None = None) -> StreamCall:
        block = self._channel._block(self._path, metadata)
        return StreamCall(self._channel, block, self._serialize, self._deserialize)


class Channel:
    """A gRPC channel to one server over one HTTP/2 connection at a time.

    :param ssl_context: TLS (with ALPN ``h2``), or None for plain text
    :param keepalive: seconds between pings while calls are open
    :param keepalive_timeout: seconds a ping may go unanswered before the connection is
        dropped (its calls fail as UNAVAILABLE)
    :param connect_timeout: seconds a connection attempt may take
    :param max_receive: the largest message accepted
    :param stall_timeout: seconds something may wait to be sent (on the server's flow
        control or stream limit, or for it to read) while nothing at all goes out, before
        the connection is dropped (its calls fail as UNAVAILABLE; see ``_Connection._hold``)
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive: float = 10.0,
        keepalive_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        max_receive: int = 64 * 1024 * 1024,
        reconnect_backoff: tuple[float, float] = (0.1, 1.0),
        stall_timeout: float = 10.0,
    ) -> None:
        self._host, self._port = host, port
        self._ssl = ssl_context
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.max_receive = max_receive
        self.stall_timeout = stall_timeout
        self._backoff_range = reconnect_backoff
        self._backoff = reconnect_backoff[0]
        self._retry_at = float("-inf")  # no connecting before this, after a failure
        self._failure: RpcError | None = None
        self._conn: _Connection | None = None
        self._live: set[_Connection] = set()  # the current one, and any still draining
        self._connecting: asyncio.Task[None] | None = None
        self._waiting: list[tuple[_Call, bytes, bytes | None]] = []  # for a connection
        self._closed = False
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._prefix = (
            b"\x83"  # :method POST
            + (b"\x87" if ssl_context is not None else b"\x86")  # :scheme https/http
        )
        self._suffix = (
            _literal(1, authority.encode())  # :authority
            + b"\x0f\x10"  # content-type (static index 31)
            + _string(b"application/grpc")
            + _literal_named(b"te", b"trailers")
            + _literal_named(b"user-agent", b"coord")
        )
        self._blocks: dict[tuple[bytes, Any], bytes] = {}

    # -- what aetcd's generated stubs call -----------------------------------------------------

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> _UnaryMethod:
        return _UnaryMethod(self, method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool = False,
    ) -> _StreamMethod:
        return _StreamMethod(self, method, request_serializer, response_deserializer)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Not spoken (coord calls no such method; aetcd's stubs make them all)."""

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"coord's gRPC transport has no {method}")

        return refuse

    stream_unary = unary_stream

    # -- header blocks ----------------------------------------------------------------------------

    def _block(self, path: bytes, metadata: Sequence[tuple[str, str]] | None) -> bytes:
        key = (path, tuple(metadata) if metadata else None)
        block = self._blocks.get(key)
        if block is None:
            block = self._prefix + _literal(4, path) + self._suffix  # 4: :path
            for name, value in metadata or ():
                block += _literal_named(name.lower().encode(), value.encode())
            if len(self._blocks) > 64:  # tokens change: keep the cache small
                self._blocks.clear()
            self._blocks[key] = block
        return block

    # -- connections -------------------------------------------------------------------------------

    def _current(self) -> _Connection | None:
        conn = self._conn
        return conn if conn is not None and conn.usable and not self._closed else None

    def _wait(self, call: _Call, block: bytes, body: bytes | None) -> None:
        """Begin *call* on the current connection, or keep it until one is made
        (connecting if nobody is) and begin it there; end it if the channel cannot
        connect or closes."""
        if call._code is not None:
            return  # ended meanwhile (cancelled, or its deadline passed)
        if self._closed:
            call._ended(_UNAVAILABLE, "the channel was closed")
            return
        conn = self._current()
        if conn is not None:
            call._begin(conn, block, body)
            return
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            failure = self._failure
            if failure is not None and loop.time() < self._retry_at:
                # Failed a moment ago: fail fast, as gRPC does in its transient failure.
                call._ended(failure.code(), failure.details() or "")
                return
            self._connecting = asyncio.ensure_future(self._connect())
        self._waiting.append((call, block, body))

    def _release_waiting(self, conn: _Connection | None, error: RpcError | None) -> None:
        waiting, self._waiting = self._waiting, []
        for call, block, body in waiting:
            if conn is not None:
                call._begin(conn, block, body)
            elif error is not None:
                call._ended(error.code(), error.details() or "")

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        closed = RpcError(_UNAVAILABLE, "the channel was closed")
        try:
            try:
                # In this task (not wait_for's, whose result may still be returned after
                # this task was cancelled): a cancel reaches the connection's own wait.
                async with asyncio.timeout(self.connect_timeout):
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self),
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl is not None else None,
                    )
            except (TimeoutError, OSError) as exc:
                raise RpcError(
                    _UNAVAILABLE,
                    f"cannot connect to {self._host}:{self._port}: {exc or 'timed out'}",
                ) from None
            except Exception as exc:  # e.g. a host name that does not encode
                raise RpcError(
                    _UNAVAILABLE, f"cannot connect to {self._host}:{self._port}: {exc!r}"
                ) from None
            if self._closed:  # closed as the connection was made
                conn.close(closed)
                raise asyncio.CancelledError
            if self._ssl is not None:
                transport = conn._transport
                protocol = transport.get_extra_info("ssl_object") if transport else None
                if protocol is None or protocol.selected_alpn_protocol() != "h2":
                    conn.close(RpcError(_UNAVAILABLE, "the server does not speak HTTP/2 (ALPN)"))
                    raise RpcError(_UNAVAILABLE, f"{self._host}:{self._port} does not speak HTTP/2")
            if conn.error is not None:  # dropped as soon as it was made
                raise RpcError(conn.error.code(), conn.error.details() or "")
        except RpcError as exc:
            self._failure, self._retry_at = exc, loop.time() + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_range[1])
            self._connecting = None
            self._release_waiting(None, exc)
            return
        except asyncio.CancelledError:  # the channel closes (and ends the waiting)
            self._connecting = None
            self._release_waiting(None, closed)
            raise
        self._failure, self._backoff = None, self._backoff_range[0]
        self._conn = conn
        self._live.add(conn)
        self._connecting = None
        self._release_waiting(conn, None)

    def _lost(self, conn: _Connection, *, gone: bool = False) -> None:
        """*conn* takes no more calls (lost, or going away; *gone*: closed)."""
        if self._conn is conn:
            self._conn = None
        if gone:
            self._live.discard(conn)

    async def close(self, grace: float | None = None) -> None:
        """End every call as UNAVAILABLE (the channel went: a failover) and close every
        connection, the current one and any still draining."""
        self._closed = True
        self._conn = None
        closed = RpcError(_UNAVAILABLE, "the channel was closed")
        conns = list(self._live)
        for conn in conns:
            conn.close(closed)
        self._live.clear()
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
            await asyncio.wait([connecting])
        self._release_waiting(None, closed)
        # Until the transports are closed (TLS's goodbye takes a round trip), or they are
        # aborted: one left closing when the event loop ends is a socket never closed.
        closing = [conn.shut for conn in conns if not conn.shut.done()]
        try:
            if closing:
                await asyncio.wait(closing, timeout=_CLOSE_WAIT)
        finally:
            for conn in conns:
                if not conn.shut.done():
                    conn.abort("the channel was closed")
