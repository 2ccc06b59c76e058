"""A connection's bytes on an anyio byte stream: the generic :class:`~._pipe.Pipe`, on
every event loop anyio runs (trio's only one; ``_asyncio`` has asyncio's own).

A connection writes from synchronous code (a call that starts, an answer to the
server's PING, a window given back as a reader takes a reply), and a stream's ``send``
is a checkpoint: so what is written waits in a buffer that one writer task sends, all of
it in one ``send`` (one system call for the frames of a burst, as an asyncio transport
does). Past :data:`HIGH` bytes waiting, the connection is told to pause its writers
(``pause_writing``), and to resume once the writer is down to :data:`LOW`: a server that
does not read holds the calls back, not the client's memory. One reader task feeds the
connection what arrives. Both run in a task group of :meth:`StreamPipe.run`, and the
first to end (the peer's end of the stream, a socket error, :meth:`StreamPipe.abort`,
the writer done after :meth:`StreamPipe.close`) ends the other: then the stream is
closed and the connection told (``connection_lost``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
from anyio.streams.tls import TLSAttribute

from ..._common.tls import open_stream

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

    from anyio.abc import ByteStream

    from ._pipe import Receiver

__all__ = ["HIGH", "LOW", "StreamPipe", "dial"]

#: Bytes waiting to be sent above which the connection's writers pause (asyncio's
#: transports pause at 64 KiB too), and at or below which they resume.
HIGH = 64 * 1024
LOW = 16 * 1024

#: What ends a connection as lost (the network's or the peer's doing, not a bug).
_BROKEN = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError)

_log = logging.getLogger("coord.backends.etcd")


async def dial(
    host: str, port: int, ssl_context: ssl.SSLContext | None, receiver: Receiver
) -> Callable[[], Awaitable[None]]:
    """Connect (TLS with ALPN ``h2`` if *ssl_context*), hand the pipe to *receiver*;
    what runs the connection.

    :raises OSError: the connection failed, or the server does not speak HTTP/2 (ALPN)
    """
    stream = await open_stream(host, port, ssl_context)
    if ssl_context is not None:
        if stream.extra(TLSAttribute.alpn_protocol, None) != "h2":
            await anyio.aclose_forcefully(stream)
            raise ConnectionError(f"{host}:{port} does not speak HTTP/2 (ALPN)")
    pipe = StreamPipe(stream, receiver)
    receiver.connection_made(pipe)
    return pipe.run


class StreamPipe:
    """The pipe of one connection on *stream*: run it with :meth:`run`."""

    __slots__ = (
        "_closing",
        "_error",
        "_out",
        "_paused",
        "_receiver",
        "_scope",
        "_size",
        "_stream",
        "_wake",
    )

    def __init__(self, stream: ByteStream, receiver: Receiver) -> None:
        self._stream = stream
        self._receiver = receiver
        self._out: list[bytes] = []
        self._size = 0  # written and not yet sent (the batch being sent included)
        self._wake: anyio.Event | None = None  # the idle writer's
        self._paused = False
        self._closing = False
        self._error: BaseException | None = None
        self._scope = anyio.CancelScope()

    # -- the pipe (synchronous: never a checkpoint) ---------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._out.append(data)
        self._size += len(data)
        self._kick()
        if self._size > HIGH and not self._paused:
            self._paused = True
            self._receiver.pause_writing()

    def close(self) -> None:
        self._closing = True
        self._kick()

    def abort(self) -> None:
        self._closing = True
        self._out.clear()
        self._size = 0
        self._scope.cancel()

    def get_write_buffer_size(self) -> int:
        return self._size

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    # -- the tasks ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read and write until the connection ends; then close the stream and tell the
        connection. Cancelled, it does the same (and the cancellation goes on)."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read)
                    await self._write()
        finally:
            self._closing = True
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(self._stream)
            self._receiver.connection_lost(self._error)

    async def _read(self) -> None:
        receive, feed = self._stream.receive, self._receiver.data_received
        try:
            while True:
                feed(await receive())
        except anyio.EndOfStream:
            pass
        except _BROKEN as exc:
            self._error = exc
        except Exception as exc:  # a bug: the connection goes, not the client
            _log.exception("the etcd connection's reader failed")
            self._error = exc
        self._scope.cancel()

    async def _write(self) -> None:
        out, send = self._out, self._stream.send
        try:
            while out or not self._closing:
                if not out:
                    self._wake = wake = anyio.Event()
                    await wake.wait()
                    continue
                data = out[0] if len(out) == 1 else b"".join(out)
                out.clear()
                await send(data)
                self._size -= len(data)
                if self._paused and self._size <= LOW:
                    self._paused = False
                    self._receiver.resume_writing()
        except _BROKEN as exc:
            self._error = exc
        self._scope.cancel()  # closed (all sent) or broken: the reader stops too
