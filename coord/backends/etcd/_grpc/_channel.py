"""The etcd transport's channel: calls to one server over one HTTP/2 connection at a time.

A channel connects on its first call and again after the connection is lost; calls made
while it connects wait for it (a failed attempt fails them as UNAVAILABLE, and calls in
the next moment fail at once, as gRPC's do in its transient failure). aetcd's generated
stubs make their calls through :meth:`Channel.unary_unary` and
:meth:`Channel.stream_stream`.

Its connections run in tasks of the task group its owner gives it (*spawn*: the etcd
connection's, which lives as long as the backend), or of its own when it is used as
``async with Channel(...)``: one task per connection, which dials it and then runs its
pipe (``_stream``: a reader and a writer) until it ends, and one for its timers
(``_timers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from ...._core.background import BackgroundTasks
from ._calls import StreamCall, UnaryCall
from ._connection import _Connection
from ._encode import grpc_message, literal, literal_named, string
from ._frames import MAX_WINDOW
from ._link import Caller, Dialer, _Link
from ._runtime import current_runtime
from ._status import UNAVAILABLE, RpcError
from ._timers import Timers

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Coroutine, Sequence
    from types import TracebackType

    from ._pipe import Event

__all__ = ["Channel"]

#: Seconds a closing channel waits for its connections' transports to close.
_CLOSE_WAIT = 0.5


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
        body = grpc_message(self._serialize(request))
        return UnaryCall(self._channel, block, body, self._deserialize, timeout)


class _StreamMethod(_Method):
    __slots__ = ()

    def __call__(self, *, metadata: Sequence[tuple[str, str]] | None = None) -> StreamCall:
        block = self._channel._block(self._path, metadata)
        return StreamCall(self._channel, block, self._serialize, self._deserialize)


class Channel(Dialer):
    """A gRPC channel to one server over one HTTP/2 connection at a time.

    :param ssl_context: TLS (with ALPN ``h2``), or None for plain text
    :param keepalive: seconds between pings while calls are open
    :param keepalive_timeout: seconds a ping may go unanswered before the connection is
        dropped (its calls fail as UNAVAILABLE)
    :param connect_timeout: seconds a connection attempt may take
    :param max_receive: the largest message accepted
    :param stall_timeout: seconds something may wait to be sent (on the server's flow
        control or stream limit, or for it to read) while nothing at all goes out, before
        the connection is dropped (its calls fail as UNAVAILABLE; see ``_Link._hold``)
    :param stream_window: each stream's flow-control window (SETTINGS_INITIAL_WINDOW_SIZE):
        the most a server sends on a stream ahead of its reader. 16 MiB by default: a
        reply of up to 8 MiB comes without waiting for a WINDOW_UPDATE, and a watch
        nobody reads holds at most a window and a message
    :param spawn: starts the channel's tasks (``start_soon`` of a task group that
        outlives the channel); without it, use the channel as ``async with``
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
        stream_window: int = 2**24,
        spawn: Callable[..., object] | None = None,
    ) -> None:
        if not 2 <= stream_window <= MAX_WINDOW:
            raise ValueError(f"stream_window must be within 2..2^31-1, not {stream_window}")
        self._host, self._port = host, port
        self._ssl = ssl_context
        self.keepalive = keepalive
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.max_receive = max_receive
        self.stall_timeout = stall_timeout
        self.stream_window = stream_window
        self._backoff_range = reconnect_backoff
        self._backoff = reconnect_backoff[0]
        self._retry_at = float("-inf")  # no connecting before this, after a failure
        self._failure: RpcError | None = None
        self._conn: _Connection | None = None
        self._live: set[_Connection] = set()  # the current one, and any still draining
        # The connection attempt under way: its scope, and what is set once it ended.
        self._connecting: tuple[anyio.CancelScope, Event] | None = None
        self._spawn = spawn
        self._own: BackgroundTasks | None = None  # with no spawn, under async with
        self.runtime = current_runtime()
        self.timers = Timers(self.runtime.clock, self._start_soon)
        self._waiting: list[tuple[Caller, bytes, bytes | None]] = []  # for a connection
        self._closed = False
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._prefix = (
            b"\x83"  # :method POST
            + (b"\x87" if ssl_context is not None else b"\x86")  # :scheme https/http
        )
        self._suffix = (
            literal(1, authority.encode())  # :authority
            + b"\x0f\x10"  # content-type (static index 31)
            + string(b"application/grpc")
            + literal_named(b"te", b"trailers")
            + literal_named(b"user-agent", b"coord")
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
            block = self._prefix + literal(4, path) + self._suffix  # 4: :path
            for name, value in metadata or ():
                block += literal_named(name.lower().encode(), value.encode())
            if len(self._blocks) > 64:  # tokens change: keep the cache small
                self._blocks.clear()
            self._blocks[key] = block
        return block

    # -- connections -------------------------------------------------------------------------------

    def _current(self) -> _Connection | None:
        conn = self._conn
        return conn if conn is not None and conn.usable and not self._closed else None

    def _wait(self, call: Caller, block: bytes, body: bytes | None) -> None:
        """Begin *call* on the current connection, or keep it until one is made
        (connecting if nobody is) and begin it there; end it if the channel cannot
        connect or closes."""
        if call._code is not None:
            return  # ended meanwhile (cancelled, or its deadline passed)
        if self._closed:
            call._ended(UNAVAILABLE, "the channel was closed")
            return
        conn = self._current()
        if conn is not None:
            call._begin(conn, block, body)
            return
        if self._connecting is None:
            failure = self._failure
            if failure is not None and self.timers.clock() < self._retry_at:
                # Failed a moment ago: fail fast, as gRPC does in its transient failure.
                call._ended(failure.code(), failure.details() or "")
                return
            # The scope is made here: a close before the task starts still ends it.
            connecting = self._connecting = (anyio.CancelScope(), self.runtime.event())
            self._start_soon(self._connect, *connecting)
        self._waiting.append((call, block, body))

    def _start_soon(self, func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        if self._spawn is not None:
            self._spawn(func, *args)
        elif self._own is not None:
            self._own.start_soon(func, *args)
        else:
            raise RuntimeError("a Channel needs spawn=, or to be used as `async with`")

    def _release_waiting(self, conn: _Connection | None, error: RpcError | None) -> None:
        waiting, self._waiting = self._waiting, []
        for call, block, body in waiting:
            if conn is not None:
                call._begin(conn, block, body)
            elif error is not None:
                call._ended(error.code(), error.details() or "")

    async def _connect(self, scope: anyio.CancelScope, ended: Event) -> None:
        """The task of one connection: make it, then run it until it ends."""
        conn = _Connection(self)
        try:
            run = await self._attempt(conn, scope)
        finally:
            self._connecting = None
            ended.set()
            self._release_waiting(None, RpcError(UNAVAILABLE, "the channel was closed"))
        if run is not None:  # (one dropped at once is run too: that closes its socket)
            await run()

    async def _attempt(
        self, conn: _Connection, scope: anyio.CancelScope
    ) -> Callable[[], Awaitable[None]] | None:
        """Connect *conn* and hand it the calls that wait (or end them if it failed);
        what runs it, if it was made."""
        closed = RpcError(UNAVAILABLE, "the channel was closed")
        run = None
        try:
            with scope:  # cancelled by close()
                run = await self._dial(conn)
            if run is None or self._closed:  # closed as the connection was made
                if run is not None:
                    conn.close(closed)
                self._release_waiting(None, closed)
                return run
            if conn.error is not None:  # dropped as soon as it was made
                raise RpcError(conn.error.code(), conn.error.details() or "")
        except RpcError as exc:
            self._failure, self._retry_at = exc, self.timers.clock() + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_range[1])
            self._release_waiting(None, exc)
            return run
        self._failure, self._backoff = None, self._backoff_range[0]
        self._conn = conn
        self._live.add(conn)
        self._release_waiting(conn, None)
        return run

    async def _dial(self, conn: _Connection) -> Callable[[], Awaitable[None]]:
        """:raises RpcError: UNAVAILABLE, if the connection could not be made in time"""
        where = f"{self._host}:{self._port}"
        try:
            with anyio.fail_after(self.connect_timeout):
                return await self.runtime.dial(self._host, self._port, self._ssl, conn)
        except (TimeoutError, OSError) as exc:
            reason = str(exc) or "timed out"
            raise RpcError(UNAVAILABLE, f"cannot connect to {where}: {reason}") from None
        except Exception as exc:  # e.g. a host name that does not encode
            raise RpcError(UNAVAILABLE, f"cannot connect to {where}: {exc!r}") from None

    def _lost(self, conn: _Link, *, gone: bool = False) -> None:
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
        closed = RpcError(UNAVAILABLE, "the channel was closed")
        conns = list(self._live)
        for conn in conns:
            conn.close(closed)
        self._live.clear()
        connecting = self._connecting
        try:
            if connecting is not None:
                connecting[0].cancel()
                await connecting[1].wait()
            self._release_waiting(None, closed)
            # Until the pipes are closed (what was written goes out first), or they are
            # aborted: a connection's task must not outlive its channel for long.
            with anyio.move_on_after(_CLOSE_WAIT):
                for conn in conns:
                    await conn.shut.wait()
        finally:
            for conn in conns:
                if not conn.shut.is_set():
                    conn.abort("the channel was closed")
            self.timers.close()

    async def __aenter__(self) -> Channel:
        if self._spawn is None and self._own is None:
            self._own = BackgroundTasks()
            await self._own.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self.close()
        finally:
            own, self._own = self._own, None
            if own is not None:
                await own.aclose()
