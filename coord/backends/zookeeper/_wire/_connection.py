"""One open connection of a session: a reader, a writer and a pinger.

* **Writes** go through one writer task fed by an unbounded memory stream: a request
  is given its xid, queued in flight and its packet handed to the writer in one
  synchronous step, so packets reach the socket in xid order, and a caller cancelled
  while waiting cannot leave half a packet on the wire (it never writes). The writer
  sends whatever has queued up in one ``send``.
* **Reads** belong to the reader task alone: it cuts frames (:mod:`._framing`) and
  hands each to :mod:`._replies`, which resolves replies in order, fires watch events
  and records the zxid.
* **Liveness**: a ping every third of the negotiated session timeout; a connection the
  server has not completed a frame on for two thirds of it is dropped, as kazoo and
  the Java client do, which leaves a third to resume the session elsewhere (bytes that
  never make a frame count for nothing: a peer trickling one is silent). After the
  event loop was blocked, a fresh ping is given a third of the timeout to be answered
  first.

The connection ends when any of its tasks fails (end of stream, a socket error, a
protocol error, silence) or :meth:`Connection.drop` is called: every request in flight
then fails with ``ConnectionLoss``, and :meth:`Connection.run` returns.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import SocketAttribute
from kazoo import exceptions as kz
from kazoo.protocol.serialization import Auth, PingInstance

from ...._core.background import declare_asyncio
from ._errors import ProtocolError
from ._framing import AUTH_XID, PING_XID, SET_WATCHES_XID, encode, encode_request
from ._replies import Replies

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._dial import Opened
    from ._pending import Reply
    from ._watches import Arming, Watches

__all__ = ["Connection"]

#: Bytes of one reply that count as hearing from the server before the reply is whole.
_PROGRESS = 64 * 1024

log = logging.getLogger("coord.backends.zookeeper")

_PING = encode_request(PING_XID, PingInstance)
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
        self._timeout = timeout
        self._replies = Replies(watches, last_zxid)
        #: When the server last completed a frame (anyio's clock).
        self.last_heard = anyio.current_time()
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

    @property
    def last_zxid(self) -> int:
        """The last zxid seen on this connection (or before it, in the session)."""
        return self._replies.last_zxid

    def submit(self, request: Any, arming: Arming | None = None) -> Reply:
        """Send *request* (a kazoo record); its reply resolves the returned Reply.

        :raises kazoo.exceptions.ConnectionLoss: if the connection is dropping
        """
        if not self.open:
            raise kz.ConnectionLoss("the connection to ZooKeeper was lost")
        sent = self._replies.in_flight.add(request, arming)
        self._outbox.send_nowait(encode_request(sent.xid, request))
        return sent.reply

    def authenticate(self, scheme: str, credential: str) -> Reply:
        """Send an auth packet; the Reply resolves to True, or with ``AuthFailedError``."""
        reply = self._replies.expect_auth()
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
            self._replies.fail_all(self.fail_with)
            self._outbox.close()
            self._outgoing.close()
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()

    async def _guard(self, task: Callable[[], Awaitable[None]]) -> None:
        declare_asyncio()  # (a task of the connection's own)
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
        dispatch = self._replies.dispatch
        for frame in self._early:
            dispatch(frame)
        buffer = self._buffer
        receive, feed = self._stream.receive, buffer.feed
        credited = 0  # bytes of an unfinished frame buffered when last counted as heard
        while True:
            frames = feed(await receive())
            # Whole frames are an answer; so is a large reply coming in at speed (a
            # 1 MiB value read while the machine is busy, with the pings queued behind
            # it), a _PROGRESS of bytes at a time. A byte now and then is not.
            if frames or len(buffer) >= credited + _PROGRESS:
                self.last_heard = anyio.current_time()
                credited = len(buffer)
            for frame in frames:
                dispatch(frame)
