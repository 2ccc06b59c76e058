"""asyncio's fast path of the etcd transport: the runtime ``_runtime`` picks on asyncio.

The generic path (``_stream``, ``anyio.Event``) runs on asyncio too, and costs more
there: anyio's asyncio stream re-arms the socket's reader on every ``receive`` (two
``epoll_ctl`` system calls) and each ``send`` takes a turn of the loop, and an
``anyio.Event`` is an ``asyncio.Event`` behind a look-up of the running backend. On a
contended acquisition (three unary calls and two stream writes) that came to a measurable
share of the client's CPU (``docs/design/etcd-transport.md``). Here the connection's
pipe is asyncio's own transport (written synchronously, paused and resumed by it), what
arrives is handed over by a protocol's callbacks, and the events are asyncio's.

Only what differs is here; the connection, its calls and its channel are the same code on
every event loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ._pipe import Runtime

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

    from ._pipe import Receiver

__all__ = ["runtime"]


def runtime() -> Runtime:
    """The fast path on the running asyncio loop (its clock is anyio's there)."""
    return Runtime(asyncio.get_running_loop().time, asyncio.Event, _Waiter, _dial, native=True)


class _Waiter:
    """An event that one task at a time waits on, on a bare future (an ``asyncio.Event``
    keeps a deque of futures, one made per wait). A waiter cancelled cancels the
    future; the next wait makes another."""

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self._set = False

    def set(self) -> None:
        self._set = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if not self._set:
            future = self._future
            if future is None or future.done():
                future = self._future = asyncio.get_running_loop().create_future()
            await future


class _Protocol(asyncio.Protocol):
    """Hands what the transport says to the connection; once it is lost, ends
    :meth:`run`."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._transport: asyncio.Transport | None = None
        self.lost = asyncio.Event()
        # Bound once: called for every read.
        self.data_received = receiver.data_received  # type: ignore[method-assign]
        self.pause_writing = receiver.pause_writing  # type: ignore[method-assign]
        self.resume_writing = receiver.resume_writing  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._receiver.connection_made(transport)  # a transport is a pipe

    def connection_lost(self, exc: Exception | None) -> None:
        self._receiver.connection_lost(exc)
        self.lost.set()

    async def run(self) -> None:
        """Wait until the connection is lost (the transport runs it); cancelled, abort
        it first."""
        try:
            await self.lost.wait()
        finally:
            if not self.lost.is_set() and self._transport is not None:
                self._transport.abort()


async def _dial(
    host: str, port: int, ssl_context: ssl.SSLContext | None, receiver: Receiver
) -> Callable[[], Awaitable[None]]:
    protocol = _Protocol(receiver)
    transport, _ = await asyncio.get_running_loop().create_connection(
        lambda: protocol,
        host,
        port,
        ssl=ssl_context,
        server_hostname=host if ssl_context is not None else None,
    )
    if ssl_context is not None:
        tls = transport.get_extra_info("ssl_object")
        if tls is None or tls.selected_alpn_protocol() != "h2":
            transport.abort()
            raise ConnectionError(f"{host}:{port} does not speak HTTP/2 (ALPN)")
    return protocol.run
