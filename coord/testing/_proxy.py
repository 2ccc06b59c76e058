"""TcpProxy: a TCP proxy in front of one server, to break the network between one client
and the store exactly where a test needs it.

It runs its own event loop on a daemon thread, so it keeps forwarding (or not) whatever
the test's own event loop is doing, and works from sync tests, from asyncio and trio
tests, and for client processes other than the test's. Every control is thread-safe and
takes effect at once, for the connections already open and for new ones:

=================  ===========================================================================
``delay(s)``       latency: each chunk is forwarded *s* seconds after it was read (in order)
``drop()``         lost replies: bytes are read and thrown away, the connections stay open
                   (``heal()`` then resets those connections: their byte streams are corrupt)
``blackhole()``    a partition: nothing is forwarded either way, connections stay open; on
                   ``heal()`` what was held is delivered, as TCP would retransmit it
``reset()``        every open connection is reset (RST), new ones are accepted
``refuse()``       the port stops listening (connections are refused) and open ones reset
``heal()``         back to normal: no delay, nothing dropped or held, listening again
=================  ===========================================================================

Example::

    with TcpProxy(etcd.client_port) as proxy:
        async with coord.connect(f"etcd://{proxy.endpoint}/test") as client:
            proxy.blackhole()          # the client is cut off from the store
            ...
            proxy.heal()
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Literal, Self

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine
    from types import TracebackType

__all__ = ["Direction", "TcpProxy"]

Direction = Literal["requests", "replies", "both"]
_Mode = Literal["pass", "drop", "hold"]
_DIRECTIONS = ("requests", "replies")


def _sides(direction: Direction) -> tuple[str, ...]:
    if direction not in ("requests", "replies", "both"):
        raise ValueError(f"direction must be 'requests', 'replies' or 'both', not {direction!r}")
    return _DIRECTIONS if direction == "both" else (direction,)


class TcpProxy:
    """A fault-injecting TCP proxy on ``127.0.0.1`` in front of ``target_host:target_port``.

    :param target_port: the server's port
    :param target_host: the server's host
    :ivar connections: connections accepted so far
    :ivar forwarded: bytes forwarded so far, per direction (``"requests"``: client to
        server, ``"replies"``: server to client)
    """

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target: tuple[str, int] = (target_host, target_port)
        self.connections: int = 0
        self.forwarded: dict[str, int] = dict.fromkeys(_DIRECTIONS, 0)
        self._delay = dict.fromkeys(_DIRECTIONS, 0.0)
        self._mode: dict[str, _Mode] = dict.fromkeys(_DIRECTIONS, "pass")
        self._listener: socket.socket | None = self._bind(0)
        self.port: int = self._listener.getsockname()[1]
        self._refusing = False  # wanted: set by the controls, applied on the proxy's thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._links: set[_Link] = set()
        self._serving: asyncio.Task[Any] | None = None
        self._accepted: set[asyncio.BaseTransport] = set()  # client connections, open
        self._pending: set[socket.socket] = set()  # accepted, no transport yet
        self._accepting = False  # the listener is read by the loop
        self._changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:<port>"``: where clients connect."""
        return f"127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        modes = ", ".join(f"{d}={self._mode[d]}+{self._delay[d]:g}s" for d in _DIRECTIONS)
        return f"<TcpProxy {self.endpoint} -> {self.target[0]}:{self.target[1]} {modes}>"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start forwarding (on a thread of its own). Returns at once, without blocking:
        the port is listening already, so clients may connect right away, and controls
        called before the thread runs are applied first thing."""
        if self._thread is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._run, args=(self._loop,), name=f"coord-proxy-{self.port}", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop: close every connection and the listener, and join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            if self._listener is not None:
                self._listener.close()
            return
        self._thread = None
        loop.call_soon_threadsafe(lambda: self._spawn(self._shutdown()))
        thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults (thread-safe, immediate) --------------------------------------------------

    def delay(self, seconds: float, *, direction: Direction = "replies") -> None:
        """Forward each chunk *seconds* after it was read (latency, order kept)."""
        for side in _sides(direction):
            self._delay[side] = float(seconds)
        self._changes()

    def drop(self, *, direction: Direction = "replies") -> None:
        """Read and discard what comes in *direction*; connections stay open."""
        for side in _sides(direction):
            self._mode[side] = "drop"
        self._changes()

    def blackhole(self) -> None:
        """Forward nothing either way, hold it; connections stay open (a partition)."""
        for side in _DIRECTIONS:
            self._mode[side] = "hold"
        self._changes()

    def reset(self) -> None:
        """Reset every open connection (new ones are accepted)."""
        self._call(self._reset_all)

    def refuse(self) -> None:
        """Stop listening (connections are refused) and reset the open ones."""
        self._refusing = True
        self._call(self._apply_listening)
        self._call(self._reset_all)

    def heal(self) -> None:
        """Back to normal: no delay, nothing dropped or held, listening again. Connections
        that lost bytes to :meth:`drop` are reset (their byte streams are corrupt)."""
        self._delay = dict.fromkeys(_DIRECTIONS, 0.0)
        self._mode = dict.fromkeys(_DIRECTIONS, "pass")
        self._refusing = False
        self._call(self._heal)

    # -- the proxy's own thread -----------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _call(self, func: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(func)  # type: ignore[arg-type]

    def _changes(self) -> None:
        self._call(self._wake)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    @staticmethod
    def _bind(port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        listener.setblocking(False)
        return listener

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._serving = asyncio.current_task()
        self._changed = asyncio.Event()
        self._stopped = asyncio.Event()
        self._apply_listening()
        await self._stopped.wait()

    def _apply_listening(self) -> None:
        """Make the listening state what the controls want. Only ever called on the
        proxy's thread, and idempotent: whatever order controls come in, a closed socket
        is never served and a refused port never listens."""
        loop = asyncio.get_running_loop()
        if self._refusing:
            if self._listener is not None:
                loop.remove_reader(self._listener)
                self._listener.close()
                self._listener = None
            self._accepting = False
        elif not self._accepting:
            if self._listener is None:
                self._listener = self._bind(self.port)
            loop.add_reader(self._listener, self._on_readable, self._listener)
            self._accepting = True

    def _on_readable(self, listener: socket.socket) -> None:
        """Accept what is waiting. (Not asyncio's server: closed while a connection is
        being accepted, it leaks that connection's socket. Here a connection is known
        from the moment it is accepted, and a shutdown closes it whatever its stage.)"""
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # none left (BlockingIOError), or out of descriptors
                return
            conn.setblocking(False)
            self._pending.add(conn)
            self._spawn(self._take(conn))

    async def _take(self, conn: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Accepted(self._accept, self._accepted), conn
            )
        finally:
            self._pending.discard(conn)  # its transport has it (or closed it)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            link = _Link(self, (reader, writer), (up_reader, up_writer))
            self._links.add(link)
            try:
                await link.run()
            finally:
                self._links.discard(link)
        finally:
            _abort(writer)  # also when cancelled by a shutdown while connecting

    def _reset_all(self) -> None:
        for link in list(self._links):
            link.abort()

    def _heal(self) -> None:
        self._wake()
        for link in list(self._links):
            if link.corrupt:
                link.abort()
        self._apply_listening()

    async def _shutdown(self) -> None:
        self._refusing = True
        self._apply_listening()
        self._reset_all()
        # Every task of the proxy ends before its loop closes: a connection still being
        # accepted, or a link whose pumps have not yet seen the reset, would otherwise be
        # destroyed pending (and its clean-up run on a closed loop, an unraisable error).
        mine = {self._serving, asyncio.current_task()}
        for _ in range(20):
            for transport in list(self._accepted):
                transport.abort()  # type: ignore[attr-defined]  # (a socket transport)
            tasks = [t for t in asyncio.all_tasks() if t not in mine]
            for task in tasks:
                task.cancel()  # (a cancelled link cancels its pumps: the next round)
            if tasks:
                await asyncio.wait(tasks, timeout=1.0)
                continue
            for conn in list(self._pending):  # accepted, and its task cancelled unstarted
                conn.close()
            self._pending.clear()
            for _ in range(3):  # the aborted transports' connection_lost callbacks
                await asyncio.sleep(0)
            if not self._accepted and not [t for t in asyncio.all_tasks() if t not in mine]:
                break
        self._stopped.set()


class _Accepted(asyncio.StreamReaderProtocol):
    """A client connection as :func:`asyncio.start_server` makes it, whose transport is
    known to the proxy from its first moment, so that a shutdown closes it even before
    its handler runs (a transport left open when the loop closes is an error)."""

    def __init__(
        self,
        handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
        accepted: set[asyncio.BaseTransport],
    ) -> None:
        super().__init__(asyncio.StreamReader(), handler)
        self._accepted = accepted
        self._mine: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._mine = transport
        self._accepted.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._mine is not None:
            self._accepted.discard(self._mine)
        super().connection_lost(exc)


class _Link:
    """One proxied connection: a pump per direction (read into a queue, write out of it
    when its time has come and its direction passes)."""

    def __init__(
        self,
        proxy: TcpProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._proxy = proxy
        self._client = client
        self._server = server
        self.corrupt = False

    async def run(self) -> None:
        tasks = [
            asyncio.ensure_future(self._pump("requests", self._client[0], self._server[1])),
            asyncio.ensure_future(self._pump("replies", self._server[0], self._client[1])),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            self.abort()

    def abort(self) -> None:
        _abort(self._client[1])
        _abort(self._server[1])

    async def _pump(
        self, side: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        chunks: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()

        async def read() -> None:
            while chunk := await reader.read(65536):
                chunks.append((time.monotonic(), chunk))
                arrived.set()
            chunks.append((time.monotonic(), b""))  # end of stream
            arrived.set()

        reading = asyncio.ensure_future(read())
        try:
            await self._write(side, chunks, arrived, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            reading.cancel()

    async def _write(
        self,
        side: str,
        chunks: deque[tuple[float, bytes]],
        arrived: asyncio.Event,
        writer: asyncio.StreamWriter,
    ) -> None:
        proxy = self._proxy
        while True:
            if not chunks:
                arrived.clear()
                await arrived.wait()
                continue
            mode = proxy._mode[side]
            read_at, chunk = chunks[0]
            if chunk and mode == "drop":
                chunks.popleft()
                self.corrupt = True
                continue
            if mode == "hold" or (due := read_at + proxy._delay[side]) > time.monotonic():
                changed = proxy._changed
                assert changed is not None
                timeout = None if mode == "hold" else due - time.monotonic()
                try:
                    await asyncio.wait_for(changed.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            chunks.popleft()
            if not chunk:
                return  # the other side finished: so does this one
            # Counted as it is handed on, before the other side can see it (a test that
            # read the reply must find it counted).
            proxy.forwarded[side] += len(chunk)
            writer.write(chunk)
            await writer.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0), as a network failure would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
