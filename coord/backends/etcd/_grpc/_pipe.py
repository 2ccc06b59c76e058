"""The shapes between an HTTP/2 connection (``_link``) and the event loop under it: the
pipe its bytes go out by, what the pipe feeds back, the events its calls wait on, and the
:class:`Runtime` that bundles what differs from one event loop to another.

They are shapes (``typing.Protocol``), not base classes, because the objects that fill
them are not ours to subclass: an ``asyncio.Transport`` is a :class:`Pipe`, and
``anyio.Event`` and ``asyncio.Event`` are each an :class:`Event`. ``_runtime`` picks the
implementations; ``_stream`` is the generic pipe on anyio streams, ``_asyncio`` asyncio's
own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable

__all__ = ["Event", "Pipe", "Receiver", "Runtime"]


class Pipe(Protocol):
    """Where a connection's bytes go out: written at once (never a checkpoint), sent in
    order. While more than a high-water mark waits to be sent, the pipe tells its
    :class:`Receiver` ``pause_writing()`` (then ``resume_writing()``)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None:
        """Send what was written, then close."""

    def abort(self) -> None:
        """Close now; what was not sent is dropped."""

    def get_write_buffer_size(self) -> int: ...


class Receiver(Protocol):
    """What a pipe tells its connection (``_link._Link`` is one)."""

    def connection_made(self, pipe: Pipe) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self, exc: BaseException | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class Event(Protocol):
    """A one-shot flag that tasks wait on: set once, never cleared. A waiter that is
    cancelled takes its cancellation away and leaves the flag as it was."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> object: ...


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the transport needs of its event loop: its clock (anyio's: cancel scope
    deadlines are on it), a factory of events, and the dialler of connections."""

    clock: Callable[[], float]
    event: Callable[[], Event]
    #: Makes an event that one task at a time waits on (a call's reply, a stream's next
    #: read, a write held back): on asyncio a bare future, a third of an Event's cost.
    waiter: Callable[[], Event]
    #: Opens a connection to ``host:port`` (TLS with ALPN ``h2`` if a context is given)
    #: and calls ``receiver.connection_made(pipe)``; returns what runs the connection
    #: until it ends (``receiver.connection_lost`` called). Not bounded in time.
    dial: Callable[
        [str, int, ssl.SSLContext | None, Receiver],
        Awaitable[Callable[[], Awaitable[None]]],
    ]
    #: Whether this is asyncio's own fast path (for tests and benchmarks).
    native: bool = False
