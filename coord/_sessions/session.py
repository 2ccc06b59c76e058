"""Session: one lease with the store, shared by every recipe object of a client.

Like etcd's ``concurrency.Session``: many tasks and many mutexes share one session, each
acquire registering its own key. The session knows when its lease is lost and tells every
waiter and holder at once, so that nobody carries on unaware.

This module holds the lease's life (open, follow, lose, close) and the tasks the session
owns; the work that runs in those tasks for a caller that may go away (registering a key,
deleting one, settling a write) is :mod:`coord._sessions.work`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from anyio.abc import AsyncResource

from .._core import retry as _retry
from .._core.background import BackgroundTasks, Endings, close_on_exit
from .._core.checks import check_ttl
from .._core.deferred import Deferred, Start
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    SessionExpiredError,
)
from .._core.stats import Counters
from .identity import identity
from .work import IN_FLIGHT, OwnedWork

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterator
    from contextlib import AbstractContextManager
    from types import TracebackType

    from ..abc import Backend, Lease

#: What using a client before ``async with`` says.
NOT_OPEN = (
    "the client is not open yet: use it inside "
    "`async with coord.connect(...) as client:` (or `async with client:`)"
)

__all__ = ["CLOSE_MARGIN", "NOT_OPEN", "Session", "SessionSource"]

#: A close waits up to the TTL for the endings out, and up to this many seconds more
#: in all (the revoke's share when the store answered none of them).
CLOSE_MARGIN = 1.0

_T = TypeVar("_T")

# Sessions a read tries (each lost under it) before it gives up.
_READ_SESSIONS = 3

_log = logging.getLogger("coord")


class SessionSource(ABC):
    """Where recipes get their session: one :class:`Session`, or a client's chain of them.

    :ivar renews: whether a lost session is followed by a new one (waiters then register
        again instead of failing)
    """

    renews: bool = False
    #: Who this client is, recorded in its waiter keys (host, pid, name).
    identity: dict[str, Any]
    #: What the locks on these sessions did (see :meth:`coord.Client.statistics`).
    counters: Counters

    @property
    @abstractmethod
    def backend(self) -> Backend:
        """The backend the sessions are on."""

    @abstractmethod
    async def live(self) -> Session:
        """A session that is not lost, waiting for the next one if need be.

        :raises SessionExpiredError: if the session is lost and none will follow
        :raises ClosedError: if closed
        """

    @abstractmethod
    def check_open(self) -> None:
        """Raise :exc:`ClosedError` (saying why) if it cannot be used now. Not a
        checkpoint."""

    @abstractmethod
    def reading(self) -> AbstractContextManager[object]:
        """A scope around a wait that needs no session (``observe``): it ends with
        :exc:`ClosedError` when the source is closed, and with
        :exc:`SessionExpiredError` once its session is lost and none will follow. Not a
        checkpoint.

        :raises ClosedError: if closed
        :raises SessionExpiredError: if the session is lost and none will follow
        """

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]], *, ending: bool = False) -> None:
        """Run *func* in a task that outlives the current session: the client's (for a
        clean-up that must go on across sessions, such as withdrawing the job of a
        cancelled put). Not a checkpoint.

        :param ending: the client's close waits for it (up to the TTL) before it stops
            its tasks: a put out, whose answer its caller waits for
        :raises ClosedError: if closed
        """
        raise ClosedError("this client runs no tasks")

    async def read(self, func: Callable[[Backend], Awaitable[_T]]) -> _T:
        """Run the read-only request ``func(backend)``; again, on the next session, if
        the current one is lost under it (ZooKeeper refuses every request between a
        lost session and the next). A checkpoint.

        :raises SessionExpiredError: if the session is lost and none will follow
        :raises ClosedError: if it is not open (see :meth:`check_open`)
        """
        self.check_open()
        for attempt in _retry.attempts():
            try:
                return await func(self.backend)
            except SessionExpiredError:
                if not self.renews or attempt >= _READ_SESSIONS:
                    raise
                await _retry.backoff(attempt)
                await self.live()
        raise AssertionError("unreachable")  # pragma: no cover


class Session(SessionSource, OwnedWork, AsyncResource):
    """A lease with the store, kept alive while the session is open.

    Example::

        async with MemoryBackend() as backend, Session(backend, ttl=10) as session:
            async with Mutex(session, "jobs/lock") as hold:
                ...

    Used directly like this, a session is one lease: once it is lost, recipes on it raise
    :exc:`coord.SessionExpiredError`. A :class:`coord.Client` opens the next one instead.

    :param backend: an open backend
    :param ttl: seconds the store keeps our entries after our last acknowledged keepalive.
        A holder that stalls longer than this loses its locks.
    """

    def __init__(self, backend: Backend, *, ttl: float = 10.0) -> None:
        self.identity: dict[str, Any] = identity()
        self.counters: Counters = Counters()
        self._ttl = check_ttl(ttl, backend.max_ttl, type(backend).__name__)
        self._backend = backend
        self._lease: Lease | None = None
        self._tg: BackgroundTasks | None = None
        self._closed = False
        self._closed_live = False  # closed by its owner while it was live (see _ended)
        self._close_by: float | None = None  # when its close gives up (see close_by)
        self._lost: anyio.Event | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._listeners: set[Callable[[], None]] = set()
        self._in_flight: anyio.Semaphore | None = None
        self._deferred = Deferred(self.start_soon)
        self._endings = Endings()  # what the close waits for (start_ending)
        #: Why the session was lost (None while it is not).
        self.reason: str | None = None

    def __repr__(self) -> str:
        lease = f"{self._lease.id:#x}" if self._lease is not None else "-"
        state = f"lost: {self.reason or 'lease lost'}" if self.lost else "live"
        return f"<coord.Session lease={lease} ttl={self._ttl:g} {state}>"

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def running(self) -> bool:
        return self._tg is not None and not self._closed

    @property
    def in_flight(self) -> anyio.Semaphore:
        if self._in_flight is None:
            raise ClosedError("the session is not open")
        return self._in_flight

    @property
    def id(self) -> int:
        """The lease id (etcd lease, ZooKeeper session id)."""
        return self.lease.id

    @property
    def lease(self) -> Lease:
        """The lease, once the session is open.

        :raises ClosedError: before ``__aenter__``
        """
        if self._lease is None:
            raise ClosedError("the session is not open")
        return self._lease

    @property
    def lost(self) -> bool:
        """True once the session is lost: its lease expired, was revoked, or its local
        deadline passed (read from the clock: no checkpoint needed), or it was closed.
        Never becomes False again."""
        if self._lost is not None and self._lost.is_set():
            return True
        return self._lease is not None and self._lease.lost

    async def wait_lost(self) -> None:
        """Return when the session is lost. A checkpoint."""
        if self._lost is None:
            raise ClosedError("the session is not open")
        await self._lost.wait()

    # -- SessionSource --------------------------------------------------------------------

    async def live(self) -> Session:
        self.check()
        return self

    def check_open(self) -> None:
        """Nothing to check: reads need only the backend (which says if it is closed),
        and :meth:`live` checks the session itself."""

    def reading(self) -> AbstractContextManager[object]:
        """No session follows this one: its loss (or its close) ends the wait."""
        return self.guard()

    def check(self) -> Lease:
        """Return the lease if the session can be used, else raise.

        :raises ClosedError: if the session is not open, or was closed while live
        :raises SessionExpiredError: if the session is lost (closed since, or not)
        """
        lease = self.lease
        if self._closed or self.lost:
            raise self._ended()
        return lease

    def _ended(self) -> ClosedError | SessionExpiredError:
        """What a use of this session raises once it cannot be used.

        A session ends in one of two ways. Its owner closes it while it is live (a
        session used alone, ``async with Session(...)``): a closed resource,
        ClosedError. Or it is lost (its lease expired or was revoked, its deadline
        passed, the store refused it), and closed after that: a client's keeper closes
        a session only once it is lost, and declares it lost before closing it when the
        client itself closes. That end is SessionExpiredError however far the closing
        has gone, because what the caller must do is the same as for any lost session:
        a waiter waits on the next session, a holder is told it lost its hold. Only the
        source (:meth:`SessionSource.live`) can say whether a next session will come or
        the client is closed; a ClosedError from the session would tell a waiter the
        client is closed when only its session was. This is the one place that decides
        it: :meth:`check`, :meth:`start_soon`, :meth:`call_after` and the settles and
        registrations of :mod:`coord._sessions.work` raise what it returns.
        """
        if self._tg is None or self._lease is None:
            return ClosedError("the session is not open")
        if self._closed_live:
            return ClosedError("the session is closed")
        return SessionExpiredError(f"session {self._lease.id:#x} is lost ({self.reason})")

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        # Granted before the task group exists, so that a failure (store unreachable)
        # is raised as itself, not wrapped in an ExceptionGroup.
        self._lost = anyio.Event()
        self._in_flight = anyio.Semaphore(IN_FLIGHT)
        lease = self._lease = await self._backend.grant(self._ttl)
        self._tg = BackgroundTasks()  # until aclose(), whatever scope around is cancelled
        await self._tg.open()
        self._tg.start_soon(self._follow, lease)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await close_on_exit(self.aclose, exc_val)

    async def aclose(self) -> None:
        """Wait for the endings out (:meth:`start_ending`: acks, claimed jobs given
        back), then tell every holder and waiter that the session is over, then revoke
        the lease (deleting our entries) and stop. The wait is bounded by the TTL, and
        the whole close by the TTL and a second: a store that answered no ending in the
        TTL has one second left for the revoke (it expires the lease anyway).

        Holders are told first: by the time another client can take a lock of ours, its
        holder here has been cancelled and sees ``hold.lost``. Shielded: cancelling this
        call still closes the session.
        """
        if self._closed:
            return
        self.close_by(anyio.current_time() + self._ttl + CLOSE_MARGIN)
        try:
            if self._tg is not None:
                await self.drain()
        finally:
            # Also when a native asyncio cancellation (which no anyio shield stops) cut
            # the drain short: else the session would stay open, its lease kept alive.
            await self._close()

    async def _close(self) -> None:
        if self._closed:
            return  # closed meanwhile, by another call
        self._closed = True
        if self._tg is None:
            return
        self._closed_live = not self.lost
        self.declare_lost("the session was closed")
        deadline = self._close_by
        if deadline is None:
            deadline = anyio.current_time() + self._ttl
        try:
            with anyio.CancelScope(deadline=deadline, shield=True):
                if self._lease is not None:
                    try:
                        await self._lease.revoke()
                    except BackendError:
                        pass  # the store expires the lease after its TTL anyway
        finally:
            # Exited outside the shield scope: scopes must nest, and the task group was
            # entered in __aenter__.
            await self._tg.aclose()

    def close_by(self, deadline: float) -> None:
        """Give up the close (the revoke) at *deadline* (``anyio.current_time()``), or at
        the earlier one already set: the client's close sets its own, which bounds its
        whole wait (the endings, then the revoke) by the TTL and a second. Not a
        checkpoint."""
        if self._close_by is None or deadline < self._close_by:
            self._close_by = deadline

    def declare_lost(self, reason: str) -> None:
        """Mark the session lost now (e.g. the store refused a request on its lease) and
        tell every waiter and holder. Idempotent; not a checkpoint."""
        if self._lost is None or self._lost.is_set():
            return
        self.reason = reason
        self._lost.set()
        for scope in list(self._scopes):
            scope.cancel()
        self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # pragma: no cover - listeners only set flags
                _log.exception("a session listener failed")

    async def _follow(self, lease: Lease) -> None:
        """Pass the lease's news on: its loss, and every interruption."""
        seen = lease.interruptions
        while True:
            await lease.wait_interrupted(seen)
            if lease.lost:
                reason = getattr(lease, "reason", None) or "the lease was lost"
                self.declare_lost(reason)
                return
            seen = lease.interruptions
            self._notify()

    # -- for the recipes ------------------------------------------------------------------

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call *listener* (synchronously, on the event loop) when the session is lost
        and at every interruption of its lease. Returns a function that stops it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    @contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """A scope cancelled when the session is lost; then SessionExpiredError is raised.

        Used around waiting, so that a waiter whose session dies is woken (etcd #19597).
        """
        self.check()
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)
        if scope.cancelled_caught and self.lost:
            raise SessionExpiredError(f"the session was lost while waiting ({self.reason})")

    def start_soon(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run *func* in the session's task group (cancelled when the session closes).
        Not a checkpoint.

        :raises SessionExpiredError: if the session was lost and closed since
        :raises ClosedError: if it is not open, or was closed while live
        """
        if self._tg is None or self._closed:
            raise self._ended()
        self._tg.start_soon(func)

    def start_ending(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """:meth:`start_soon` for work that the session's close waits for (up to the TTL)
        before it tells its holders and revokes its lease: a claimed job given back as
        it was, which the revoke would leave naming a dead claim (the next claim would
        count an attempt the job never had). Not a checkpoint.

        :raises SessionExpiredError: if the session was lost and closed since
        :raises ClosedError: if it is not open, or was closed while live
        """
        if self._tg is None or self._closed:
            raise self._ended()
        self._endings.start(self._tg.start_soon, func)

    async def drain(self) -> None:
        """Wait until the work of :meth:`start_ending` has ended, up to the TTL (at once
        if there is none, or the session is lost: its claims went with it). Shielded:
        the close that calls it is. A checkpoint."""
        with anyio.move_on_after(self._ttl, shield=True):
            await self._endings.wait(lambda: self.lost, self.listen)  # lost: no wait

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]], *, ending: bool = False) -> None:
        """A session used alone is its own client: its task group."""
        (self.start_ending if ending else self.start_soon)(func)

    def call_after(self, delay: float, func: Callable[[], None]) -> Start:
        """Call *func* (it must not block) once *delay* seconds have passed, on the one
        task of the session that waits for all such calls, unless the returned
        :class:`~coord._core.deferred.Start` is cancelled first. Not a checkpoint.

        :raises SessionExpiredError: if the session was lost and closed since
        :raises ClosedError: if it is not open, or was closed while live
        """
        if self._tg is None or self._closed:
            raise self._ended()
        return self._deferred.call_after(delay, func)

    async def retry(
        self, func: Callable[[], Awaitable[Any]], *, failed: BackendUnavailable | None = None
    ) -> Any:
        """Await ``func()``, again after each BackendUnavailable (with backoff) while the
        session lives: a store that comes back within the TTL costs nobody anything.

        :param failed: the error of a first attempt the caller made itself (awaited
            directly, without this call's frame: a waiter's memory is mostly frames)
        """
        for attempt in _retry.attempts():
            if failed is not None:
                if self.lost:
                    raise SessionExpiredError(f"the session was lost ({self.reason})") from failed
                await _retry.backoff(attempt)
            try:
                return await func()
            except BackendUnavailable as exc:
                failed = exc
        raise AssertionError("unreachable")  # pragma: no cover
