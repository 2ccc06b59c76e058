"""The wire client: ZooKeeper requests on an anyio connection, no thread.

Example::

    async with WireClient([("127.0.0.1", 2181)], session_timeout=10) as zk:
        path, stat = await zk.create("/jobs/job-", b"x", ephemeral=True, sequence=True)
        watcher = Watcher()
        data, stat = await zk.get_data(path, watch=watcher)
        event = await watcher.wait()

Every request method is a checkpoint, except the ``*_nowait`` ones: they send at once
(the session must be connected: see :meth:`WireClient.wait_connected`) and return a
:class:`~._pending.Reply` to await later, or to give a callback, so that a batch of
requests goes out in one round trip without a task per request. A request sent while
the connection is down waits for the session to resume (bound it with ``fail_after``);
one in flight when the connection drops raises ``ConnectionLoss``: the server may or
may not have applied it.
A cancelled request stops waiting for its answer; the server may still apply it. Errors
are kazoo's exception classes (see :mod:`._errors`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal, overload

import anyio
from anyio.abc import AsyncResource
from kazoo import exceptions as kz
from kazoo.protocol.serialization import (
    CloseInstance,
    Delete,
    Exists,
    GetChildren,
    GetChildren2,
    GetData,
    SetData,
    Sync,
)
from kazoo.protocol.states import KeeperState

from ._errors import MultiFailed
from ._ops import create_op, with_path
from ._records import Multi, MultiResults
from ._session import Session, State
from ._watches import Arming, Kind, Watches

if TYPE_CHECKING:
    import ssl
    from collections.abc import Iterator, Sequence
    from types import TracebackType

    from kazoo.protocol.states import ZnodeStat

    from ._pending import Reply
    from ._session import StateListener
    from ._watches import WatchCallback

__all__ = ["WireClient"]

#: The longest aclose() waits for the server to confirm a CloseSession (seconds).
CLOSE_TIMEOUT = 2.0

_CREATES = (1, 15, 19)  # create, create2, createContainer


class WireClient(AsyncResource):
    """One ZooKeeper session, spoken over anyio (asyncio or trio), with no thread.

    :param hosts: ``(host, port)`` pairs of the ensemble; give IP addresses (a name is
        resolved by anyio's ``getaddrinfo``, which may use a worker thread)
    :param session_timeout: the session timeout to ask for (seconds); the server's
        answer is :attr:`negotiated_timeout`
    :param connect_timeout: how long entering waits for the session (default: the
        session timeout)
    :param auth: ``(scheme, credential)`` pairs sent on every connection, such as
        ``("digest", "user:password")``
    :param chroot: a path prefixed to every path sent and stripped from every path
        received
    :param read_only: accept a read-only server (by default it counts as a failed
        connection attempt)
    :param resume: ``(session_id, password)`` of an existing session to take over
    :param ssl_context: connect over TLS with it (the server verified as it says; the
        hosts are the names it checks)
    """

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        *,
        session_timeout: float = 10.0,
        connect_timeout: float | None = None,
        auth: Sequence[tuple[str, str]] = (),
        chroot: str = "",
        read_only: bool = False,
        resume: tuple[int, bytes] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if chroot and (not chroot.startswith("/") or chroot == "/"):
            raise ValueError(f"a chroot is an absolute path other than /: {chroot!r}")
        self._chroot = chroot.rstrip("/")
        self._session = Session(
            hosts,
            watches=Watches(self._unchroot),
            session_timeout=session_timeout,
            connect_timeout=session_timeout if connect_timeout is None else connect_timeout,
            auth=auth,
            read_only=read_only,
            resume=resume,
            ssl_context=ssl_context,
        )
        self._stack: contextlib.AsyncExitStack | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> WireClient:
        """Open the session (a checkpoint, bounded by ``connect_timeout``).

        :raises kazoo.exceptions.ConnectionLoss: no server opened a session in time
        :raises kazoo.exceptions.AuthFailedError: a server refused the credentials
        """
        stack = contextlib.AsyncExitStack()
        self._tasks = await stack.enter_async_context(anyio.create_task_group())
        try:
            await self._tasks.start(self._session.run)
        except BaseException:
            self._tasks.cancel_scope.cancel()
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(  # type: ignore[override]  # (True: our own cancellation ended)
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        """:meth:`aclose`, then wait for the client's tasks to end. The body runs in
        the client's task group: an ``aclose()`` from another task cancels it (that
        cancellation ends here, as a task group's own does)."""
        await self.aclose()
        stack, self._stack = self._stack, None
        if stack is not None:
            # (Not shielded: the tasks are cancelled already and close their socket
            # shielded; the task group was entered outside any scope of ours.)
            if isinstance(exc_val, anyio.get_cancelled_exc_class()):
                return await stack.__aexit__(exc_type, exc_val, exc_tb)
            await stack.aclose()  # (any other exception propagates as it is)
        return None

    async def aclose(self) -> None:
        """Close the session: send CloseSession (waiting up to 2 s for its answer,
        shielded), drop the connection and cancel the client's tasks (they are gone once
        the ``async with`` block is left). Idempotent; callable from any task. Every
        watch then fires (type NONE, state CLOSED), and every request, waiting or in
        flight, fails with ``ConnectionClosedError``."""
        if self._closed:
            return
        self._closed = True
        self._session.closing = True
        conn = self._session.current
        if conn is not None:
            conn.fail_with = _closed  # (the server drops the connection after the close)
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + CLOSE_TIMEOUT
                with contextlib.suppress(kz.ZookeeperError):
                    await conn.submit(CloseInstance).wait()
        self._session.end(State.CLOSED, _closed, KeeperState.CLOSED)
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    # -- the session ---------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._session.state

    @property
    def session_id(self) -> int:
        return self._session.session_id

    @property
    def password(self) -> bytes:
        return bytes(self._session.password)

    @property
    def server(self) -> tuple[str, int] | None:
        """The ``(address, port)`` of the server the session is connected to, if it is."""
        conn = self._session.current
        return conn.server if conn is not None else None

    @property
    def negotiated_timeout(self) -> float:
        """The session timeout the server granted (seconds)."""
        return self._session.negotiated_timeout

    @property
    def last_zxid(self) -> int:
        """The last zxid seen in an answer."""
        return self._session.last_zxid

    @property
    def connected(self) -> bool:
        """Whether the session has an open connection now (requests go out at once)."""
        return self._session.current is not None

    @property
    def dial_failures(self) -> int:
        """Connection attempts that failed before the current connection was opened (or,
        while disconnected, since the last one dropped)."""
        return self._session.dial_failures

    @property
    def last_error(self) -> BaseException | None:
        """Why the last connection ended (None if none did)."""
        return self._session.last_error

    async def wait_connected(self) -> None:
        """Return once the session has an open connection. A checkpoint only if it waits
        (bound it with ``fail_after``).

        :raises kazoo.exceptions.SessionExpiredError: the session is lost
        :raises kazoo.exceptions.ConnectionClosedError: the client is closed
        """
        if self._session.current is None:
            await self._session.connection()

    def drop_connection(self) -> None:
        """Break the connection as a network failure would (for fault injection): the
        session is SUSPENDED, then resumed on a new connection. Not a checkpoint."""
        conn = self._session.current
        if conn is not None:
            conn.drop(kz.ConnectionLoss("the connection was dropped on purpose"))

    @contextlib.contextmanager
    def reconnection_held(self) -> Iterator[None]:
        """Within the block, a dropped connection is not replaced (for fault injection:
        a session expired meanwhile is then found expired, not taken back). The
        session's deadline still runs."""
        self._session.hold()
        try:
            yield
        finally:
            self._session.release()

    def add_listener(self, listener: StateListener) -> None:
        """Call *listener* with each new :class:`State`, on the event loop."""
        self._session.add_listener(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self._session.remove_listener(listener)

    # -- requests ------------------------------------------------------------------------

    async def create(
        self,
        path: str,
        data: bytes = b"",
        acl: Sequence[Any] | None = None,
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        container: bool = False,
    ) -> tuple[str, ZnodeStat]:
        """Create a node; return its path (with the sequence number) and stat.

        :raises kazoo.exceptions.NodeExistsError, NoNodeError: (no parent), ...
        """
        await self.wait_connected()
        options = {"ephemeral": ephemeral, "sequence": sequence, "container": container}
        created: tuple[str, ZnodeStat] = await self.create_nowait(path, data, acl, **options).wait()
        return created

    async def delete(self, path: str, version: int = -1) -> None:
        """Delete a node (at *version* only, unless -1)."""
        await self._call(Delete(self._path(path), version))

    async def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None:
        """The node's stat, or None; *watch* fires when it is created, changed or deleted."""
        full = self._path(path)
        stat: ZnodeStat | None = await self._call(Exists(full, watch is not None), full, watch)
        return stat

    async def get_data(
        self, path: str, watch: WatchCallback | None = None
    ) -> tuple[bytes, ZnodeStat]:
        """The node's data and stat; *watch* fires when it changes or is deleted."""
        full = self._path(path)
        data, stat = await self._call(GetData(full, watch is not None), full, watch)
        return (data if data is not None else b""), stat

    async def set_data(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        """Set the node's data (at *version* only, unless -1); return the new stat."""
        stat: ZnodeStat = await self._call(SetData(self._path(path), data, version))
        return stat

    @overload
    async def get_children(
        self, path: str, watch: WatchCallback | None = ..., include_data: Literal[False] = ...
    ) -> list[str]: ...
    @overload
    async def get_children(
        self, path: str, watch: WatchCallback | None = ..., *, include_data: Literal[True]
    ) -> tuple[list[str], ZnodeStat]: ...
    async def get_children(
        self, path: str, watch: WatchCallback | None = None, include_data: bool = False
    ) -> list[str] | tuple[list[str], ZnodeStat]:
        """The node's children's names (and its stat, with *include_data*); *watch*
        fires when a child is added or removed, or the node deleted."""
        full = self._path(path)
        record = GetChildren2 if include_data else GetChildren
        result: Any = await self._call(record(full, watch is not None), full, watch, Kind.CHILD)
        return result  # type: ignore[no-any-return]

    async def sync(self, path: str) -> str:
        """Wait until the server this client talks to has caught up with the leader."""
        synced = await self._call(Sync(self._path(path)))
        return self._unchroot(synced)

    async def multi(self, ops: Sequence[Any]) -> MultiResults:
        """Apply *ops* (from :mod:`._ops`) all or none; one result per operation:
        ``(path, stat or None)`` for a create (ZooKeeper 3.8 gives no stat there),
        True for a delete or check, a stat for a set; and, as ``zxid``, the
        transaction's zxid (the czxid of the nodes it created; see MultiResults).

        :raises MultiFailed: if one failed (nothing was applied); it names which
        """
        request = Multi([with_path(op, self._path(op.path)) for op in ops])
        results: MultiResults = await self._call(request)
        if any(isinstance(result, Exception) for result in results):
            raise MultiFailed(results)
        out = MultiResults(self._multi_result(op, r) for op, r in zip(ops, results, strict=True))
        out.zxid = results.zxid
        return out

    # -- requests sent without waiting ---------------------------------------------------

    def get_data_nowait(self, path: str, watch: WatchCallback | None = None) -> Reply:
        """:meth:`get_data`, sent now; the Reply settles with ``(data, stat)``. Not a
        checkpoint.

        :raises kazoo.exceptions.ConnectionLoss: the session is not connected now
        """
        full = self._path(path)
        reply = self._send(GetData(full, watch is not None), full, watch)
        reply.convert = _data_and_stat
        return reply

    def data_watched(self, path: str, watch: WatchCallback) -> bool:
        """Whether a data watch on *path* with *watch* is armed (its read answered) and has
        not fired yet: another read to arm it would be redundant. Not a checkpoint."""
        return self._session.watches.armed(Kind.DATA, self._path(path), watch)

    def get_children_nowait(self, path: str, watch: WatchCallback | None = None) -> Reply:
        """:meth:`get_children` with ``include_data``, sent now; the Reply settles with
        ``(children, stat)``. Not a checkpoint.

        :raises kazoo.exceptions.ConnectionLoss: the session is not connected now
        """
        full = self._path(path)
        return self._send(GetChildren2(full, watch is not None), full, watch, Kind.CHILD)

    def create_nowait(
        self, path: str, data: bytes = b"", acl: Sequence[Any] | None = None, **options: bool
    ) -> Reply:
        """:meth:`create` (same keyword options), sent now; the Reply settles with
        ``(path, stat)``. Not a checkpoint.

        :raises kazoo.exceptions.ConnectionLoss: the session is not connected now
        """
        op = create_op(path, data, acl, **options)
        reply = self._send(with_path(op, self._path(path)))
        reply.convert = lambda created: (self._unchroot(created[0]), created[1])
        return reply

    def _send(
        self,
        request: Any,
        path: str = "",
        watch: WatchCallback | None = None,
        kind: Kind = Kind.DATA,
    ) -> Reply:
        arming = Arming(path, kind, watch) if watch is not None else None
        return self._session.connection_nowait().submit(request, arming)

    def _multi_result(self, op: Any, result: Any) -> Any:
        if op.type not in _CREATES:
            return result
        if isinstance(result, str):  # ZooKeeper answers a create2 in a multi as a create
            return self._unchroot(result), None
        path, stat = result
        return self._unchroot(path), stat

    async def _call(
        self,
        request: Any,
        path: str = "",
        watch: WatchCallback | None = None,
        kind: Kind = Kind.DATA,
    ) -> Any:
        await self.wait_connected()
        return await self._send(request, path, watch, kind).wait()

    # -- chroot --------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"a ZooKeeper path is absolute: {path!r}")
        if not self._chroot:
            return path
        return self._chroot if path == "/" else self._chroot + path

    def _unchroot(self, path: str) -> str:
        chroot = self._chroot
        if not chroot or not path.startswith(chroot):
            return path
        return path[len(chroot) :] or "/"


def _data_and_stat(value: tuple[bytes | None, ZnodeStat]) -> tuple[bytes, ZnodeStat]:
    data, stat = value
    return (data if data is not None else b""), stat


def _closed() -> BaseException:
    error: BaseException = kz.ConnectionClosedError("the ZooKeeper client is closed")
    return error
