"""Opening a connection: TCP and the ConnectRequest, across the host list.

The hosts are tried in turn, starting at a random one (so that the clients of a fleet
spread over the ensemble), each attempt bounded in time; after a round in which every
host failed, a pause that doubles from 50 ms up to :data:`MAX_BACKOFF` (and the same
pause before redialling when the last connection broke as soon as it opened). Whoever
dials bounds the whole: the first session by its connect timeout, a resume by the
session's deadline.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import anyio

from ..._common.tls import open_stream
from ._errors import ProtocolError
from ._framing import FrameBuffer, decode_connect, encode_connect

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

    from anyio.abc import ByteStream

__all__ = ["MAX_BACKOFF", "Dialer", "Opened", "open_connection"]

log = logging.getLogger("coord.backends.zookeeper")

#: The longest pause between two rounds of connection attempts (seconds).
MAX_BACKOFF = 1.0
_FIRST_BACKOFF = 0.05
_FAILURES = (OSError, TimeoutError, ProtocolError, anyio.EndOfStream, anyio.BrokenResourceError)

#: An open connection: the stream, its frame buffer, any frame read after the
#: ConnectResponse, and the ConnectResponse (kazoo's ``Connect``).
Opened = tuple["ByteStream", FrameBuffer, list[bytes], Any]


async def open_connection(
    host: str, port: int, connect: Any, ssl_context: ssl.SSLContext | None = None
) -> Opened:
    """Connect to *host* (over TLS with *ssl_context*), send the ConnectRequest
    *connect* and read the answer.

    Not bounded in time: the caller bounds the attempt.

    :raises OSError: the connection (or the TLS handshake: ``ssl.SSLError``) failed
    :raises ProtocolError: the answer is not a ConnectResponse
    """
    stream = await open_stream(host, port, ssl_context)
    try:
        await stream.send(encode_connect(connect))
        buffer = FrameBuffer()
        frames: list[bytes] = []
        while not frames:
            frames = buffer.feed(await stream.receive())
        reply = decode_connect(frames[0])
    except BaseException:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
        raise
    return stream, buffer, frames[1:], reply


class Dialer:
    """Connection attempts across a host list.

    :ivar failure: why the last attempt failed (for the error of a session that could
        not be opened)
    :ivar failures: attempts that failed in the current (or last) :meth:`dial`; each
        is logged at DEBUG only (the caller says what an outage means)
    """

    def __init__(
        self, hosts: Sequence[tuple[str, int]], *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        if not hosts:
            raise ValueError("no ZooKeeper host given")
        self.hosts = list(hosts)
        self._ssl_context = ssl_context
        self._next = random.randrange(len(self.hosts))
        self._backoff = _FIRST_BACKOFF
        self.failure: BaseException | None = None
        self.failures = 0

    def __str__(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.hosts)

    async def dial(
        self, connect: Any, *, attempt: float, accept: Callable[[Any], bool], pause: bool = False
    ) -> Opened:
        """Send *connect* to one host after another until *accept* takes an answer.

        :param attempt: the time bound of one attempt (seconds)
        :param accept: judges a ConnectResponse: False to try the next host (the
            connection is closed), or raise ProtocolError to count the attempt as
            failed; any other exception ends the dialing
        :param pause: the last connection broke soon after it opened: wait first, the
            pause growing as for a round of failures (a server that accepts a session
            and breaks it at once is not reconnected to in a tight loop)
        """
        if pause:
            await self._pause()
        else:
            self._backoff = _FIRST_BACKOFF
        self.failures = 0
        while True:
            for _ in self.hosts:
                host, port = self.hosts[self._next]
                self._next = (self._next + 1) % len(self.hosts)
                opened = await self._attempt(host, port, connect, attempt)
                if opened is not None and await self._judged(host, port, opened, accept):
                    return opened
            await self._pause()

    async def _pause(self) -> None:
        await anyio.sleep(self._backoff * random.uniform(0.5, 1.0))
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)

    async def _attempt(self, host: str, port: int, connect: Any, attempt: float) -> Opened | None:
        try:
            with anyio.fail_after(attempt):
                return await open_connection(host, port, connect, self._ssl_context)
        except _FAILURES as exc:
            self._failed(host, port, exc)
            return None

    async def _judged(
        self, host: str, port: int, opened: Opened, accept: Callable[[Any], bool]
    ) -> bool:
        """``accept(answer)``; the connection is closed unless it is accepted."""
        try:
            if accept(opened[3]):
                return True
            self._failed(host, port, ProtocolError(f"{host}:{port} is read-only"))
        except ProtocolError as exc:
            self._failed(host, port, exc)
        except BaseException:
            await _close(opened)
            raise
        await _close(opened)
        return False

    def _failed(self, host: str, port: int, error: BaseException) -> None:
        self.failure = error
        self.failures += 1
        log.debug("connecting to ZooKeeper %s:%s failed: %r", host, port, error)


async def _close(opened: Opened) -> None:
    with anyio.CancelScope(shield=True):
        await opened[0].aclose()
