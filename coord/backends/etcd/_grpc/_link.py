"""What one HTTP/2 connection of the etcd transport sends, into its pipe (``_pipe``: an
anyio stream's, or asyncio's transport): its streams, flow control both ways, the
answers the server asks for, keepalive pings and the stall clock (see ``_Link._hold``);
and what the connection needs of its calls and its channel (:class:`Caller`,
:class:`Dialer`), so that it imports neither.

What it receives is ``_connection._Connection``'s, a subclass of :class:`_Link`.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, ClassVar

from ._frames import (
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_FRAME,
    MAX_HEADER_BLOCK,
    MAX_WINDOW,
    PING,
    RST_STREAM,
    SETTING_ENABLE_PUSH,
    SETTING_HEADER_TABLE_SIZE,
    SETTING_INITIAL_WINDOW,
    SETTING_MAX_HEADER_LIST,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from ._status import UNAVAILABLE, RpcError

if TYPE_CHECKING:
    import grpc

    from ._pipe import Event, Pipe, Runtime
    from ._timers import Timer, Timers

__all__ = ["Caller", "Dialer", "_Link", "_Stream"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_REFUSED_STREAM = 7
_CANCEL = 8
#: The largest flow-control window (RFC 9113, 6.9.1): what we grant, so the server never
#: waits for us; topped up once a sixteenth of it was received.
_WINDOW = MAX_WINDOW
_TOP_UP = 2**27
_DEFAULT_FRAME = MAX_FRAME
_MAX_STREAM_ID = 2**31 - 1
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


class Caller(ABC):
    """What a connection needs of the call on one of its streams (the calls, in
    ``_calls.py``, are these): so that the connection does not import the calls."""

    __slots__ = ()

    _code: grpc.StatusCode | None  # set once the call has ended
    #: Whether the call keeps the messages it is given until its reader takes them (then
    #: it gives their bytes back to the stream's window with ``_Link.credit``).
    holds_replies: ClassVar[bool] = False

    @abstractmethod
    def _begin(self, conn: _Link, block: bytes, body: bytes | None) -> None:
        """Open the call's stream on *conn* (or wait for the next connection)."""

    @abstractmethod
    def _on_stream(self, stream: _Stream) -> None:
        """The connection opened the call's stream."""

    @abstractmethod
    def _message(self, data: bytes) -> None:
        """A whole gRPC message arrived on the call's stream."""

    @abstractmethod
    def _again(self) -> bool:
        """The server refused the stream unprocessed: whether the call goes again."""

    @abstractmethod
    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        """The call ended with *code* (the first end counts)."""


class Dialer(ABC):
    """What a connection needs of its channel (``_channel.Channel``): its settings, and
    where calls go when the connection cannot take them."""

    keepalive: float
    keepalive_timeout: float
    max_receive: int
    stall_timeout: float
    stream_window: int
    runtime: Runtime
    timers: Timers

    @abstractmethod
    def _lost(self, conn: _Link, *, gone: bool = False) -> None:
        """*conn* takes no more calls (lost, or going away; *gone*: closed)."""

    @abstractmethod
    def _wait(self, call: Caller, block: bytes, body: bytes | None) -> None:
        """Begin *call* on the current connection, or once there is one."""


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
        "window",
    )

    def __init__(self, call: Caller, send_window: int, receive_window: int) -> None:
        self.call = call
        self.id = 0
        self.send_window = send_window
        self.pending: deque[tuple[bytes, bool, Event | None]] = deque()
        self.received = bytearray()  # gRPC framing: a message may span DATA frames
        self.message = 0  # the length of the message being received, 0 if none
        self.unacked = 0  # bytes received since we last granted them back
        self.window = receive_window  # what the server may still send (see credit)
        self.headers_seen = False
        self.ended_local = False


class _Link:
    """What an HTTP/2 connection sends: its streams, flow control both ways, the answers
    the peer asks for, keepalive and the stall clock (what it receives:
    ``_connection._Connection``, this class's subclass). Its pipe calls it as a
    :class:`~._pipe.Receiver`."""

    def __init__(self, channel: Dialer) -> None:
        self._channel = channel
        self._half_window = channel.stream_window // 2  # see credit()
        self._pipe: Pipe | None = None
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._send_window = DEFAULT_WINDOW
        self._initial_window = DEFAULT_WINDOW  # each new stream's, as the server says
        self._max_frame = _DEFAULT_FRAME
        self._max_streams = 2**31
        self._queued: deque[tuple[Caller, bytes, bytes | None]] = deque()  # over the limit
        self._blocked: dict[_Stream, None] = {}  # streams with data waiting for window
        self._unacked = 0
        self._paused = False  # the transport's buffer is full: writes wait (see below)
        self._answers = 0  # PING and SETTINGS answered while paused
        self._to_answer: list[bytes] = []  # answers to the frames being read, in order
        self._held_since: float | None = None  # see _hold
        self._timers = channel.timers
        self._stall: Timer | None = None
        self._ping: Timer | None = None
        self._ping_due: Timer | None = None
        self._pings = 0
        self._ping_sent = b""  # the payload of the PING in flight (see _pinged)
        self.error: RpcError | None = None  # set once the connection is lost
        self.draining = False  # GOAWAY received: no new streams
        #: Set when the pipe is closed.
        self.shut: Event = channel.runtime.event()

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, pipe: Pipe) -> None:
        self._pipe = pipe
        settings = struct.pack(
            ">HIHIHIHI",
            SETTING_ENABLE_PUSH,
            0,
            SETTING_INITIAL_WINDOW,
            self._channel.stream_window,
            SETTING_HEADER_TABLE_SIZE,
            4096,
            SETTING_MAX_HEADER_LIST,
            MAX_HEADER_BLOCK,
        )
        pipe.write(
            _PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", _WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        reason = f"the connection to etcd was lost: {exc}" if exc else "etcd closed the connection"
        self._fail(RpcError(UNAVAILABLE, reason))
        self.shut.set()

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
        if self._pipe is not None:
            self._pipe.close()

    def abort(self, why: str) -> None:
        self._fail(RpcError(UNAVAILABLE, why))
        if self._pipe is not None:
            self._pipe.abort()

    @property
    def usable(self) -> bool:
        return self.error is None and not self.draining and self._next_id < _MAX_STREAM_ID

    # -- sending -------------------------------------------------------------------------------

    def start(self, call: Caller, block: bytes, body: bytes | None) -> None:
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

    def _open_stream(self, call: Caller, block: bytes, body: bytes | None) -> _Stream:
        assert self._pipe is not None
        stream = _Stream(call, self._initial_window, self._channel.stream_window)
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
            self._pipe.write(headers + frame(DATA, END_STREAM, sid, body))
            if self._held_since is not None:
                self._progressed()
        else:
            self._pipe.write(headers)
            if body is not None:
                self.send(stream, body, end=True)
        if self._ping is None and self._ping_due is None:
            self._schedule_ping()
        return stream

    def send(self, stream: _Stream, data: bytes, end: bool, done: Event | None = None) -> bool:
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
        assert self._pipe is not None
        self._send_window -= len(data)
        stream.send_window -= len(data)
        self._pipe.write(frame(DATA, END_STREAM if end else 0, stream.id, data))
        stream.ended_local = stream.ended_local or end
        if self._held_since is not None:
            self._progressed()
        return True

    def _flush(self) -> None:
        """Send what flow control held back, as far as the windows allow and until the
        transport pauses us."""
        assert self._pipe is not None
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
                self._pipe.write(frame(DATA, END_STREAM if last else 0, stream.id, chunk))
                sent = True
                if rest:
                    stream.pending[0] = (rest, end, done)
                    continue
                stream.pending.popleft()
                stream.ended_local = stream.ended_local or end
                if done is not None:
                    done.set()
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
        if self._pipe is not None and self.error is None:
            self._pipe.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", _CANCEL)))
        self._drained()

    def _drained(self) -> None:
        """A stream ended: start one that waited for room, or close a connection that
        is going away once it has none left."""
        if self._queued:
            self._start_queued()
        if self.draining and not self._streams:
            self.close(RpcError(UNAVAILABLE, "etcd is going away (GOAWAY)"))

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
        assert self._pipe is not None
        self._pipe.write(b"".join(answers) if len(answers) > 1 else answers[0])

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
            self._held_since = self._timers.clock()
        if self._stall is None and self.error is None:
            due = self._held_since + self._channel.stall_timeout
            self._stall = self._timers.call_at(due, self._check_stall)

    def _progressed(self) -> None:
        """Something held back went out: the clock starts again for what still waits."""
        held = self._blocked or self._queued
        self._held_since = self._timers.clock() if held else None

    def _check_stall(self) -> None:
        self._stall = None
        if self._held_since is None or self.error is not None:
            return
        due = self._held_since + self._channel.stall_timeout
        if self._timers.clock() < due:
            self._stall = self._timers.call_at(due, self._check_stall)
            return
        if self._blocked or any(call._code is None for call, _, _ in self._queued):
            timeout = self._channel.stall_timeout
            self.abort(f"nothing could be sent to etcd for {timeout:g} s (flow control)")
        # else nobody waits now: the next hold finds the clock past due, and drops it.

    # -- keepalive ------------------------------------------------------------------------------

    def _schedule_ping(self) -> None:
        self._ping = self._timers.call_later(self._channel.keepalive, self._send_ping)

    def _send_ping(self) -> None:
        self._ping = None
        if self.error is not None or not self._streams:
            return  # nothing waits on this connection: ping when something does
        assert self._pipe is not None
        self._pings += 1
        self._ping_sent = self._pings.to_bytes(8, "big")
        self._pipe.write(frame(PING, 0, 0, self._ping_sent))
        timeout = self._channel.keepalive_timeout
        self._ping_due = self._timers.call_later(timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        self._ping_due = None
        self.abort(f"etcd did not answer a ping within {self._channel.keepalive_timeout:g} s")

    # -- receiving ------------------------------------------------------------------------------

    def _grant(self, n: int) -> None:
        """Give back *n* bytes of the connection's window, at once (topped up by the
        share): the streams' own windows are what holds the server back, so that a
        stream whose reader is slow does not stop the others."""
        self._unacked += n
        if self._unacked >= _TOP_UP:
            assert self._pipe is not None
            self._pipe.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unacked)))
            self._unacked = 0

    def credit(self, stream: _Stream, n: int) -> None:
        """Give back *n* bytes of *stream*'s window, once half its window waits to be
        given back (a WINDOW_UPDATE per half a window, not per message). A stream's
        replies that its reader has not taken are not given back (``_Connection._data``):
        a watch nobody reads holds at most a window and a message."""
        stream.unacked += n
        if stream.unacked >= self._half_window and self._open(stream):
            assert self._pipe is not None
            self._pipe.write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", stream.unacked)))
            stream.window += stream.unacked
            stream.unacked = 0

    def _open(self, stream: _Stream) -> bool:
        return self.error is None and self._streams.get(stream.id) is stream


def _unblock(stream: _Stream) -> None:
    """Wake the writers of what *stream* held back: it ended (they see that)."""
    for _, _, done in stream.pending:
        if done is not None:
            done.set()
    stream.pending.clear()
