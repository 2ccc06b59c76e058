"""One open connection of a session: a reader, a writer and a pinger.

* **Writes** go through one writer task fed by an unbounded memory stream: a request
  is given its xid, queued in flight and its packet handed to the writer in one
  synchronous step, so packets reach the socket in xid order, and a caller cancelled
  while waiting cannot leave half a packet on the wire (it never writes). The writer
  sends whatever has queued up in one ``send``.
* **Reads** belong to the reader task alone: it resolves replies in order
  (:mod:`._pending`), fires watch events (:mod:`._watches`) and records the zxid.
* **Liveness**: a ping every third of the negotiated session timeout; a connection the
  server has not answered on for two thirds of it is dropped, as kazoo and the Java
  client do, which leaves a third to resume the session elsewhere. After the event loop
  was blocked, a fresh ping is given a third of the timeout to be answered first.

The connection ends when any of its tasks fails (end of stream, a socket error, a
protocol error, silence) or :meth:`Connection.drop` is called: every request in flight
then fails with ``ConnectionLoss``, and :meth:`Connection.run` returns.
"""

from __future__ import annotations

import logging
import math
import struct
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import SocketAttribute
from kazoo import exceptions as kz
from kazoo.protocol.serialization import Auth, Exists, PingInstance, Watch

from ._errors import ProtocolError, error_for
from ._framing import (
    AUTH_XID,
    PING_XID,
    REPLY_HEADER_SIZE,
    SET_WATCHES_XID,
    WATCH_XID,
    encode,
    encode_request,
    reply_header,
)
from ._pending import InFlight, Reply

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._dial import Opened
    from ._watches import Arming, Watches

__all__ = ["Connection"]

log = logging.getLogger("coord.backends.zookeeper")

_NO_NODE = kz.NoNodeError.code
_PING = encode_request(PING_XID, PingInstance)
_DECODING = (struct.error, ValueError, IndexError, UnicodeDecodeError, TypeError)
#: Failures that are the network's or the server's, not a bug of ours.
_EXPECTED = (
    OSError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    ProtocolError,
    kz.ConnectionLoss,
)


class Connection:
    """The requests, watch events and pings of one open connection.

    :param timeout: the negotiated session timeout (seconds)
    :param last_zxid: the last zxid the session saw (updated from replies)
    """

    def __init__(self, opened: Opened, *, watches: Watches, timeout: float, last_zxid: int) -> None:
        self._stream, self._buffer, self._early, _ = opened
        address = self._stream.extra(SocketAttribute.remote_address)
        #: The server's ``(address, port)``.
        self.server = (address[0], address[1]) if isinstance(address, tuple) else (address, 0)
        self._watches = watches
        self._timeout = timeout
        self.last_zxid = last_zxid
        #: When the server was last heard from (anyio's clock).
        self.last_heard = anyio.current_time()
        self._in_flight = InFlight()
        self._auth: deque[Reply] = deque()
        self._outbox, self._outgoing = anyio.create_memory_object_stream[bytes](math.inf)
        self._scope = anyio.CancelScope()
        #: Makes the error of the requests in flight when the connection ends (by
        #: default ConnectionLoss: their outcome is unknown).
        self.fail_with: Callable[[], BaseException] = kz.ConnectionLoss
        #: False once the connection is dropping: no request is sent on it any more.
        self.open = True
        #: Why the connection ended (None while it runs).
        self.error: BaseException | None = None

    # -- sending (synchronous: never a checkpoint) -----------------------------------------

    def submit(self, request: Any, arming: Arming | None = None) -> Reply:
        """Send *request* (a kazoo record); its reply resolves the returned Reply.

        :raises kazoo.exceptions.ConnectionLoss: if the connection is dropping
        """
        if not self.open:
            raise kz.ConnectionLoss("the connection to ZooKeeper was lost")
        sent = self._in_flight.add(request, arming)
        self._outbox.send_nowait(encode_request(sent.xid, request))
        return sent.reply

    def authenticate(self, scheme: str, credential: str) -> Reply:
        """Send an auth packet; the Reply resolves to True, or with ``AuthFailedError``."""
        reply = Reply()
        self._auth.append(reply)
        self._outbox.send_nowait(
            encode(AUTH_XID, Auth.type, Auth(0, scheme, credential).serialize())
        )
        return reply

    def set_watches(self, request: Any) -> None:
        """Send a SetWatches record (its answer carries nothing to wait for)."""
        self._outbox.send_nowait(encode_request(SET_WATCHES_XID, request))

    def drop(self, reason: BaseException) -> None:
        """End the connection. Not a checkpoint."""
        if self.error is None:
            self.error = reason
        self.open = False
        self._scope.cancel()

    # -- running ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the reader, writer and pinger until the connection ends; then fail every
        request in flight (with ``fail_with()``) and close the socket."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._guard, self._read)
                    tg.start_soon(self._guard, self._write)
                    tg.start_soon(self._guard, self._keepalive)
        finally:
            self.open = False
            self._in_flight.fail_all(self.fail_with)
            auth, self._auth = self._auth, deque()
            for reply in auth:
                reply.resolve(error=kz.ConnectionLoss())
            self._outbox.close()
            self._outgoing.close()
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()

    async def _guard(self, task: Callable[[], Awaitable[None]]) -> None:
        try:
            await task()
        except Exception as exc:  # any failure of a task ends the connection, not the client
            if not isinstance(exc, _EXPECTED):
                log.exception("ZooKeeper connection failed")
            self.drop(exc)

    async def _write(self) -> None:
        outgoing = self._outgoing
        async for packet in outgoing:
            batch = [packet]
            try:
                while True:
                    batch.append(outgoing.receive_nowait())
            except anyio.WouldBlock:
                pass
            await self._stream.send(packet if len(batch) == 1 else b"".join(batch))

    async def _keepalive(self) -> None:
        # The server is silent when nothing was read for two thirds of the timeout and a
        # ping sent a third of it ago is still unanswered (in a running loop the second
        # follows from the first: a ping goes out every third). A loop that was blocked (a
        # long synchronous call, ten thousand tasks started at once) wakes this task late:
        # its stall is not the server's silence, and a session the server still holds
        # must not be dropped for it. It pings at once and gives the answer a third; once
        # only until something is read, so that a loop late at every wake still finds a
        # dead server out.
        interval, silence = self._timeout / 3, self._timeout * 2 / 3
        now = anyio.current_time()
        next_ping = wake = now + interval
        asked = math.inf  # when the first ping since the last byte read went out
        forgiven = False  # a stall was forgiven since the last byte read
        while True:
            now = anyio.current_time()
            if asked <= self.last_heard:
                asked, forgiven = math.inf, False
            if now - wake > interval / 4 and not forgiven:
                next_ping, asked, forgiven = now, math.inf, True  # judge from a fresh ping
            if now >= self.last_heard + silence and now >= asked + interval:
                # The reader's turns first: an answer may have come in while the loop
                # was blocked.
                await anyio.lowlevel.checkpoint()
                await anyio.lowlevel.checkpoint()
                if asked > self.last_heard:
                    raise kz.ConnectionLoss(
                        f"the server did not answer for {now - self.last_heard:.3g}s"
                    )
                continue
            if now >= next_ping:
                self._outbox.send_nowait(_PING)
                next_ping = now + interval
                asked = min(asked, now)
            wake = min(next_ping, max(self.last_heard + silence, asked + interval))
            await anyio.sleep(wake - now)

    async def _read(self) -> None:
        for frame in self._early:
            self._dispatch(frame)
        receive, feed = self._stream.receive, self._buffer.feed
        while True:
            data = await receive()
            self.last_heard = anyio.current_time()
            for frame in feed(data):
                self._dispatch(frame)

    # -- reading (in the reader task) ----------------------------------------------------------

    def _dispatch(self, frame: bytes) -> None:
        xid, zxid, err = reply_header(frame)
        if xid >= 0:
            self._answer(xid, zxid, err, frame)
        elif xid == WATCH_XID:
            try:
                watch, _ = Watch.deserialize(frame, REPLY_HEADER_SIZE)
            except _DECODING as exc:
                raise ProtocolError("an undecodable watch event") from exc
            self._watches.fire(watch.type, watch.path)
        elif xid == AUTH_XID:
            if not self._auth:
                raise ProtocolError("an auth answer to no auth packet")
            error = kz.AuthFailedError(f"authentication refused (code {err})") if err else None
            self._auth.popleft().resolve(True, error)
        elif xid not in (PING_XID, SET_WATCHES_XID):
            raise ProtocolError(f"a reply with xid {xid}")

    def _answer(self, xid: int, zxid: int, err: int, frame: bytes) -> None:
        sent = self._in_flight.pop(xid)
        if zxid > 0:
            self.last_zxid = zxid
        request, arming = sent.request, sent.arming
        if err == 0:
            try:
                value = request.deserialize(frame, REPLY_HEADER_SIZE) if _decodes(request) else None
            except _DECODING as exc:
                raise ProtocolError(f"an undecodable answer to {type(request).__name__}") from exc
            if arming is not None:
                self._watches.arm(arming)
            sent.reply.resolve(value)
        elif err == _NO_NODE and request.type == Exists.type:
            if arming is not None:
                self._watches.arm(arming, exists=False)
            sent.reply.resolve(None)
        else:
            sent.reply.resolve(error=error_for(err))


def _decodes(request: Any) -> bool:
    return hasattr(request, "deserialize")
