"""The client: one backend connection, the sessions on it, and the recipe factory."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anyio.abc import AsyncResource

from ._core.background import close_on_exit
from ._core.checks import check_bool, check_duration, check_layout, check_type
from ._core.exceptions import ClosedError, ConfigurationError
from ._core.extras import needs_extra
from ._core.url import SCHEMES, parse_url
from ._election.election import Election
from ._jobs.queue import Exhausted, Queue
from ._locks.mutex import Mutex
from ._locks.rwlock import RWLock
from ._locks.semaphore import Semaphore
from ._membership.group import Group
from ._membership.partitioner import Partitioner
from ._sessions import identity as _identity
from ._sessions.keeper import SessionKeeper, SessionStatistics
from ._sessions.readonly import NoSessions
from .abc import Backend

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from ._core.stats import Histogram
    from ._sessions.session import Session, SessionSource

sniffio: Any
try:  # not a dependency of anyio >= 4.16; installed wherever trio is (trio needs it)
    import sniffio
except ModuleNotFoundError:
    sniffio = None

__all__ = ["Client", "ClientStatistics", "connect"]

_EXTRAS = {"etcd": "etcd", "zk": "zookeeper", "memory": ""}
# The layouts with a read-write lock, a semaphore (the others: coord's, when defaulted).
_HAS = {"rwlock": ("kazoo", "curator"), "semaphore": ("curator",)}


@dataclass(frozen=True)
class ClientStatistics(SessionStatistics):
    """Counters of one client (see :class:`coord.Client`). Frozen; read with
    :meth:`Client.statistics`.

    :ivar session_id: id of the current session's lease (etcd lease id, ZooKeeper session
        id), None between sessions
    :ivar sessions_opened: sessions opened so far, the first one included
    :ivar sessions_lost: sessions lost so far (closing the client does not count)
    :ivar renew_failures: failed attempts to open a new session
    :ivar renews: whether a lost session is followed by a new one
    :ivar acquires: holds granted: of a mutex, a semaphore, either side of a read-write
        lock, an election term (re-entering a reentrant mutex is not one)
    :ivar waits: those acquires that had to wait for someone ahead of them
    :ivar losses: holds that ended lost (the block raised :exc:`coord.LockLost`)
    :ivar wait_time: how long acquires took, from the call to the grant
        (:class:`coord.Histogram`, seconds)
    :ivar hold_time: how long holds lasted, from the grant to the release
    """

    acquires: int
    waits: int
    losses: int
    wait_time: Histogram
    hold_time: Histogram


class Client(AsyncResource):
    """A connection to a coordination store, and the sessions on it.

    Use :func:`coord.connect` to make one from a URL, or inject a backend::

        async with Client(MemoryBackend(), ttl=5) as client:
            async with client.mutex("jobs/lock") as hold:
                ...

    A client is meant to live as long as the service. It keeps one session (an etcd
    lease, a ZooKeeper session) at a time; when that session is lost, its holders are
    cancelled and get :exc:`coord.LockLost`, its waiters register again on the next
    session, and the client opens that next session by itself, backing off while the
    store cannot be reached. ``renew=False`` makes the first loss final instead: then
    every later acquire raises :exc:`coord.SessionExpiredError`, and so does
    ``election.observe()``, at once, even while it waits for a change.

    :param backend: an unopened backend; the client opens and closes it
    :param ttl: each session's lease TTL in seconds
    :param renew: open a new session when the current one is lost
    :param identity: a name for this client, recorded (with host and pid) in every waiter
        key it registers, so that ``await mutex.waiters()`` can say who holds and waits
    :raises TypeError: for an argument of the wrong type
    :param sessions: False for a client that only reads and watches: it opens no session
        (no lease, no keepalive), and refuses to acquire, campaign or put a job
    :param layout: the default layout of its mutexes and elections (and read-write
        locks, where the peer has them): ``"coord"``, ``"etcd"`` to share them with etcd's
        Go ``concurrency`` package, ``etcdctl lock`` and ``etcdctl elect``, ``"kazoo"`` or
        ``"curator"`` to share them with kazoo's or Curator's recipes on ZooKeeper (see
        :class:`coord.Mutex`)
    :raises ConfigurationError: for a TTL the store does not accept, a bad identity, an
        unknown layout, or one the store does not speak
    """

    def __init__(
        self,
        backend: Backend,
        *,
        ttl: float = 10.0,
        renew: bool = True,
        identity: str | None = None,
        sessions: bool = True,
        layout: str = "coord",
    ) -> None:
        check_type(backend, Backend, "backend", "a coord.abc.Backend")
        check_bool(sessions, "sessions")
        self._layout = check_layout(layout, backend.layouts, type(backend).__name__)
        self._backend = backend
        who = _identity.identity(_identity.check_identity(identity))
        self._keeper = SessionKeeper(backend, ttl=ttl, renew=renew, identity=who)
        self._source: SessionSource = self._keeper
        if not sessions:
            self._source = NoSessions(backend, who, self._keeper.counters)
        self._entered = False

    def __repr__(self) -> str:
        state = self._keeper.describe() if self._source is self._keeper else "no sessions"
        return f"<coord.Client {self._backend.url} {state}>"

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def identity(self) -> dict[str, Any]:
        """Who this client is, as recorded in its waiter keys: ``host``, ``pid`` and
        ``name`` (if given to :func:`connect`). A copy."""
        return dict(self._keeper.identity)

    @property
    def session(self) -> Session:
        """The current session. It may be lost (``session.lost``) while the next one is
        being opened. Not a checkpoint.

        :raises ClosedError: before the client is open
        :raises ConfigurationError: if the client opens no session (``sessions=False``)
        """
        if isinstance(self._source, NoSessions):
            self._source.refuse()
        return self._keeper.current

    def sessions(self) -> AsyncIterator[Session]:
        """Follow the sessions: the current one first, then each new one as it opens.

        Ends when the client is closed (or, with ``renew=False``, once the session is
        lost)::

            async for session in client.sessions():
                print("session", session.id)
                await session.wait_lost()
        """
        return self._keeper.changes()

    def statistics(self) -> ClientStatistics:
        """Counters of this client's sessions and locks, as a frozen snapshot. Not a
        checkpoint."""
        counters = self._keeper.counters
        return ClientStatistics(
            **self._keeper.statistics().__dict__,
            acquires=counters.acquires,
            waits=counters.waits,
            losses=counters.losses,
            wait_time=counters.wait_time.snapshot(),
            hold_time=counters.hold_time.snapshot(),
        )

    @property
    def layout(self) -> str:
        """The default layout of this client's mutexes and elections."""
        return self._layout

    def mutex(
        self,
        name: str,
        *,
        reentrant: bool = False,
        local_handoff: int | None = None,
        layout: str | None = None,
    ) -> Mutex:
        """A :class:`coord.Mutex` called *name* on this client's sessions. Not a checkpoint.

        :param reentrant: let the holding task enter again (released when its outermost
            block exits)
        :param local_handoff: cohort mode: this client's tasks queue locally behind one
            waiter key, and a releasing task hands the lock straight to the next local
            waiter, with no round trip, at most this many times in a row (1 to 65535;
            None: strict FIFO across all tasks, the default)
        :param layout: ``"coord"``, ``"etcd"`` (etcd's Go ``concurrency.Mutex``, as
            ``etcdctl lock`` takes it), ``"kazoo"`` (kazoo's ``Lock``) or ``"curator"``
            (Curator's ``InterProcessMutex``): see :class:`coord.Mutex`; None: the
            client's
        :raises ConfigurationError: if *name*, *local_handoff* or *layout* is not valid
            (cohort mode is coord's layout only; ``"etcd"`` needs an etcd store,
            ``"kazoo"`` and ``"curator"`` a ZooKeeper one)
        """
        return Mutex(
            self._source,
            name,
            reentrant=reentrant,
            local_handoff=local_handoff,
            layout=self._layout if layout is None else layout,
        )

    def semaphore(self, name: str, limit: int, *, layout: str | None = None) -> Semaphore:
        """A :class:`coord.Semaphore` called *name*: at most *limit* holders at once.
        Not a checkpoint.

        :param layout: ``"coord"`` or ``"curator"`` (Curator's
            ``InterProcessSemaphoreV2``: see :class:`coord.Semaphore`); None: the
            client's, if it has a semaphore, else coord's (etcd's Go package and kazoo's
            layout have none)
        :raises ConfigurationError: for a bad *name* or *limit*, or a layout without a
            semaphore
        """
        return Semaphore(self._source, name, limit, layout=layout or self._default("semaphore"))

    def rwlock(self, name: str, *, layout: str | None = None) -> RWLock:
        """A :class:`coord.RWLock` called *name*: ``async with rw.read`` / ``rw.write``.
        Not a checkpoint.

        :param layout: ``"coord"``, ``"kazoo"`` or ``"curator"`` (their read-write
            locks: see :class:`coord.RWLock`); None: the client's, if it has a
            read-write lock, else coord's (etcd's Go package has none)
        :raises ConfigurationError: if *name* is not a valid name, or for a layout
            without a read-write lock
        """
        return RWLock(self._source, name, layout=layout or self._default("rwlock"))

    def _default(self, recipe: str) -> str:
        """The client's layout for *recipe*, where its peer has one; else coord's."""
        return self._layout if self._layout in _HAS.get(recipe, ()) else "coord"

    def election(self, name: str, *, layout: str | None = None, selector: bool = False) -> Election:
        """A :class:`coord.Election` called *name* on this client's sessions. Not a
        checkpoint.

        :param layout: ``"coord"``, ``"etcd"`` (etcd's Go ``concurrency.Election``, as
            ``etcdctl elect`` takes it), ``"kazoo"`` (kazoo's ``Election``) or
            ``"curator"`` (Curator's ``LeaderLatch``): see :class:`coord.Election`;
            None: the client's
        :param selector: with the ``"curator"`` layout, Curator's ``LeaderSelector``
        :raises ConfigurationError: if *name* or *layout* is not valid, or *selector* is
            given in another layout
        """
        return Election(
            self._source,
            name,
            layout=self._layout if layout is None else layout,
            selector=selector,
        )

    def group(self, name: str) -> Group:
        """A :class:`coord.Group` called *name* on this client's sessions: join it, list
        and watch its members. Not a checkpoint.

        :raises ConfigurationError: if *name* is not a valid name
        """
        return Group(self._source, name)

    def partitioner(self, name: str, *, partitions: int) -> Partitioner:
        """A :class:`coord.Partitioner` called *name*: *partitions* partitions shared out
        among the members that join it, each owned by one at a time, fenced. Not a
        checkpoint.

        :raises ConfigurationError: for a bad name, or a count not from 1 to 10,000
        :raises TypeError: if *partitions* is not an int
        """
        return Partitioner(self._source, name, partitions)

    def queue(
        self,
        name: str,
        *,
        max_attempts: int = 5,
        on_exhausted: Exhausted = "park",
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
        dedupe_window: float = 600.0,
        timeout: float | None = None,
        priorities: bool = False,
    ) -> Queue:
        """A durable job queue with per-key order and fenced acks (see
        :class:`coord.Queue`). Not a checkpoint; nothing is written until a put.

        :param timeout: seconds a claim's body may run (for jobs put without a timeout
            of their own); None: no limit
        :param priorities: jobs of this queue may have a priority: its workers read
            every outstanding job at each look (see :class:`coord.Queue`)

        :raises ConfigurationError: for a bad name or option
        """
        return Queue(
            self._source,
            name,
            max_attempts=max_attempts,
            on_exhausted=on_exhausted,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            dedupe_window=dedupe_window,
            timeout=timeout,
            priorities=priorities,
        )

    async def __aenter__(self) -> Client:
        if self._entered:
            raise ClosedError("a Client can be opened only once")
        self._entered = True
        _check_event_loop(self._backend)
        try:
            await self._backend.__aenter__()
        except BaseException:
            await self._backend.aclose()  # whatever it opened before it failed
            raise
        try:
            if isinstance(self._source, NoSessions):
                self._source.open()
            else:
                await self._keeper.__aenter__()
        except BaseException:
            await self._backend.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await close_on_exit(self.aclose, exc_val)

    async def aclose(self) -> None:
        """Close the session and the connection. Shielded. First the calls out that
        change the store get their answers, up to the TTL (a job's ack or release, a
        claimed job given back, a put, a cancel); then holders are cancelled and told;
        then the lease is revoked; the whole close within the TTL and a second. A put
        made once the close has begun raises :exc:`coord.ClosedError`: nothing was
        sent."""
        if isinstance(self._source, NoSessions):
            self._source.close()
        try:
            await self._keeper.aclose()
        finally:
            await self._backend.aclose()


def connect(
    url: str | None = None,
    *,
    ttl: float = 10.0,
    renew: bool = True,
    identity: str | None = None,
    connect_timeout: float = 10.0,
    sessions: bool = True,
    layout: str = "coord",
    **options: Any,
) -> Client:
    """Make a client for the store at *url*; use it with ``async with``.

    Example::

        async with coord.connect("etcd://10.0.0.1:2379,10.0.0.2:2379/myapp") as client:
            ...

    URLs: ``etcd://[user:password@]host[:port][,host[:port]...][/namespace]`` (port 2379 by
    default), ``zk://host[:port][,...][/chroot]`` (port 2181), ``memory://[name]``. The URL,
    the TTL (against the store's limits) and every option are checked here, before
    anything connects; so is the event loop, when called from one. Not a checkpoint.

    :param url: the store's URL; default: the ``COORD_URL`` environment variable
    :param ttl: seconds the store keeps this client's keys after its last keepalive
    :param renew: open a new session when the current one is lost (the default); False
        makes the first loss final
    :param identity: a name for this client, recorded in its waiter keys (see
        :meth:`coord.Mutex.waiters`)
    :param connect_timeout: how long entering the client waits for the store to answer
        (in its own protocol: a port of another server fails at once) before raising
        :exc:`coord.BackendUnavailable`; only the first connection, not the reconnections
        of a client that lives on through outages. Ignored by ``memory://``.
    :param sessions: False for a client that only reads and watches: it opens no session
        (see :class:`coord.Client`)
    :param layout: the default layout of the client's mutexes and elections:
        ``"coord"`` (the default), or ``"etcd"`` (etcd's Go ``concurrency`` package,
        etcd stores only; see :class:`coord.Mutex`)
    :param options: backend options (see the backend classes, e.g. TLS files for etcd)
    :raises TypeError: for an argument or option of the wrong type
    :raises ConfigurationError: for a bad URL, TTL, layout or option, a missing extra,
        or an asyncio-only store used under trio
    """
    if url is None:
        url = os.environ.get("COORD_URL")
        if not url:
            raise ConfigurationError("no URL given and COORD_URL is not set")
    _identity.check_identity(identity)
    connect_timeout = check_duration(connect_timeout, "connect_timeout")
    check_layout(layout)
    parsed = parse_url(url)
    module_name, class_name = SCHEMES[parsed.scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS[parsed.scheme]
        raise ConfigurationError(f"{needs_extra(f'{parsed.scheme}://', extra)} ({exc})") from exc
    backend_class = getattr(module, class_name)
    if not backend_class.any_event_loop:
        _check_event_loop(backend_class)
    if parsed.scheme != "memory":
        options["connect_timeout"] = connect_timeout
    backend: Backend = backend_class.from_url(parsed, **options)
    return Client(
        backend, ttl=ttl, renew=renew, identity=identity, sessions=sessions, layout=layout
    )


def _check_event_loop(backend: Backend | type[Backend]) -> None:
    """Refuse an asyncio-only backend under another event loop (trio).

    Without sniffio trio is not installed either, so only asyncio can be running (anyio's
    own ``current_async_library`` reasons the same way).
    """
    if backend.any_event_loop or sniffio is None:
        return
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return  # not in an event loop yet: checked again when the client is opened
    if library != "asyncio":
        name = backend.__name__ if isinstance(backend, type) else type(backend).__name__
        raise ConfigurationError(
            f"{name} runs on asyncio only ({backend.asyncio_only_because}), not on "
            f"{library}; run it with anyio.run(..., backend='asyncio')"
        )
