"""Session: one lease with the store, shared by every recipe object of a client.

Like etcd's ``concurrency.Session``: many tasks and many mutexes share one session, each
acquire registering its own key. The session knows when its lease is lost and tells every
waiter and holder at once, so that nobody carries on unaware.

Work that must happen even if its caller goes away (registering a key, deleting one) runs
in a task of the session, which owns its outcome; the caller only waits for it. An anyio
shield does not stop a native asyncio cancellation (``task.cancel()``,
``asyncio.timeout``), so a cleanup awaited by the caller itself could be cut short and
leave a key behind; a cleanup owned by the session cannot.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from anyio.abc import AsyncResource, TaskGroup
from anyio.lowlevel import checkpoint_if_cancelled

from . import _keys, _retry
from ._checks import check_seconds
from ._deferred import Deferred, Start
from ._exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    ConfigurationError,
    EntryGoneError,
    SessionExpiredError,
)
from ._stats import Counters
from ._waiters import identity
from .abc import Entry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterator
    from contextlib import AbstractContextManager
    from types import TracebackType

    from .abc import Backend, Lease, Position

#: What using a client before ``async with`` says.
NOT_OPEN = (
    "the client is not open yet: use it inside "
    "`async with coord.connect(...) as client:` (or `async with client:`)"
)

__all__ = ["NOT_OPEN", "Session", "SessionSource", "check_ttl"]

_T = TypeVar("_T")

# Sessions a read tries (each lost under it) before it gives up.
_READ_SESSIONS = 3

_log = logging.getLogger("coord")

# Registrations and deletes one session has in flight at a time. A burst of thousands
# of acquires (or of cancellations) would otherwise send thousands of requests at once:
# on ZooKeeper each registration reads the whole queue on the session's single
# connection, on etcd each is a gRPC call on the event loop; either way the lease's own
# keepalive then waits behind them long enough to lose the session. A few dozen at a time
# keep the line short and the store just as busy.
_IN_FLIGHT = 32


def check_ttl(ttl: object, backend: Backend | None = None) -> float:
    """Return *ttl* as a float if it is a valid lease TTL, else raise ConfigurationError
    (TypeError if it is not a number)."""
    ttl = check_seconds(ttl, "ttl")
    if not math.isfinite(ttl) or ttl <= 0:
        raise ConfigurationError(f"ttl must be a positive number of seconds, not {ttl!r}")
    if backend is not None and ttl > backend.max_ttl:
        raise ConfigurationError(
            f"ttl={ttl:g}s is longer than {type(backend).__name__} allows ({backend.max_ttl:g}s)"
        )
    return ttl


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

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run *func* in a task that outlives the current session: the client's (for a
        clean-up that must go on across sessions, such as withdrawing the job of a
        cancelled put). Not a checkpoint.

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


class Session(SessionSource, AsyncResource):
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
        self._ttl = check_ttl(ttl, backend)
        self._backend = backend
        self._lease: Lease | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
        self._lost: anyio.Event | None = None
        self._scopes: set[anyio.CancelScope] = set()
        self._listeners: set[Callable[[], None]] = set()
        self._in_flight: anyio.Semaphore | None = None
        self._deferred = Deferred(self.start_soon)
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

        :raises ClosedError: if the session is closed
        :raises SessionExpiredError: if the session is lost
        """
        lease = self.lease
        if self._closed:
            raise ClosedError("the session is closed")
        if self.lost:
            raise SessionExpiredError(f"session {lease.id:#x} is lost ({self.reason})")
        return lease

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        # Granted before the task group exists, so that a failure (store unreachable)
        # is raised as itself, not wrapped in an ExceptionGroup.
        self._lost = anyio.Event()
        self._in_flight = anyio.Semaphore(_IN_FLIGHT)
        lease = self._lease = await self._backend.grant(self._ttl)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._follow, lease)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Tell every holder and waiter that the session is over, then revoke the lease
        (deleting our entries) and stop. The revoke is bounded by the TTL.

        Holders are told first: by the time another client can take a lock of ours, its
        holder here has been cancelled and sees ``hold.lost``. Shielded: cancelling this
        call still closes the session.
        """
        if self._closed:
            return
        self._closed = True
        if self._tg is None:
            return
        self.declare_lost("the session was closed")
        try:
            with anyio.move_on_after(self._ttl, shield=True):
                if self._lease is not None:
                    try:
                        await self._lease.revoke()
                    except BackendError:
                        pass  # the store expires the lease after its TTL anyway
        finally:
            # Exited outside the shield scope: scopes must nest, and the task group was
            # entered in __aenter__.
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)

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
                _log.exception("coord: a session listener failed")

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
        """Run *func* in the session's task group (cancelled when the session closes)."""
        if self._tg is None or self._closed:
            raise ClosedError("the session is not open")
        self._tg.start_soon(func)

    def spawn(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A session used alone is its own client: its task group."""
        self.start_soon(func)

    def start_after(self, delay: float, func: Callable[[], Coroutine[Any, Any, None]]) -> Start:
        """Run *func* in the session's task group once *delay* seconds have passed (one
        task of the session waits for all such starts), unless the returned
        :class:`~coord._deferred.Start` is cancelled first. Not a checkpoint."""
        if self._tg is None or self._closed:
            raise ClosedError("the session is not open")
        return self._deferred.start_after(delay, func)

    async def retry(self, func: Callable[[], Awaitable[Any]]) -> Any:
        """Await ``func()``, again after each BackendUnavailable (with backoff) while the
        session lives: a store that comes back within the TTL costs nobody anything."""
        for attempt in _retry.attempts():
            try:
                return await func()
            except BackendUnavailable as exc:
                if self.lost:
                    raise SessionExpiredError(f"the session was lost ({self.reason})") from exc
                await _retry.backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def register(
        self,
        prefix: str,
        *,
        value: bytes = b"",
        ahead: int | None = 1,
        kind: str | None = None,
        waiter_id: Callable[[], str] | None = None,
        retry: bool = True,
        durable: bool = False,
        on_abandon: Callable[[Entry | None], None] | None = None,
    ) -> Position:
        """Register a new waiter entry under *prefix* on this session's lease (or a
        durable entry, bound to no lease, with *durable*: a queued job).

        A checkpoint. The request runs in a task of the session, which owns its outcome:
        it is repeated after BackendUnavailable while the session lives (with *retry*),
        and whenever it ends without a result for its caller (an error, or the caller
        went away while it was in flight) that task deletes the entry it may have
        created. So a cancelled or failed call leaves nothing behind.

        With *on_abandon* (a queued job, whose clean-up must not depend on the session),
        a failed call deletes nothing (its caller says the outcome is unknown), and when
        the caller goes away *on_abandon* is called instead, with the entry created (None
        if that is not known) once the request has ended.

        :raises SessionExpiredError: if the session is or becomes lost
        :raises EntryGoneError: if the entry vanished before the answer (deleted by
            someone else): nothing is left; register again
        """
        await checkpoint_if_cancelled()  # already cancelled: register nothing at all
        lease = self.check()
        new_id = waiter_id() if waiter_id is not None else _keys.new_waiter_id()
        request = _Registration(prefix, new_id, lease, value, ahead, kind, retry, durable)
        request.on_abandon = on_abandon
        self.start_soon(lambda: request.run(self))
        try:
            await request.done.wait()
        except BaseException:
            if request.done.is_set() and request.position is not None:
                (on_abandon or self.discard)(request.position.entry)  # ours to delete
            else:
                request.abandoned = True  # the task deletes it when the reply comes
            raise
        if request.error is not None:
            raise request.error
        if request.position is None:  # the session's tasks were cancelled under it
            if self._closed and not self.lost:
                raise ClosedError("the session was closed during a registration")
            raise SessionExpiredError(f"the session ended during a registration ({self.reason})")
        return request.position

    async def delete(self, entry: Entry) -> bool | None:
        """Delete *entry* in a task of the session, guarded by its creation revision.

        Waits for the outcome, shielded from anyio cancellation and bounded by the TTL:
        True if deleted, False if it was not there, None if not known (the store did not
        answer in time: the task keeps trying in the background while the session lives,
        CURATOR-678; or the session is lost, and the entry with it). A native asyncio
        cancellation stops the wait, not the delete.
        """
        if self._tg is None or self._closed or self.lost:
            return None
        outcome: list[bool] = []
        done = anyio.Event()
        self._tg.start_soon(self._delete_until_done, entry, outcome, done)
        with anyio.move_on_after(self._ttl, shield=True):
            await done.wait()
        return outcome[0] if outcome else None

    async def settle(
        self,
        func: Callable[[], Awaitable[_T]],
        *,
        undo: Callable[[_T | None], None] | None = None,
        shield: bool = True,
    ) -> _T | None:
        """Await ``func()`` in a task of the session, which owns its outcome: a native
        asyncio cancellation of the caller stops the wait, not the work. Waits bounded by
        the TTL, and shielded from anyio cancellation unless *shield* is False (then an
        anyio cancellation, too, stops the wait and not the work).

        If the caller goes away (cancelled, or the TTL passed) *undo* is called when the
        work ends: with its result, or with None if it raised or was cancelled with the
        session (its outcome is unknown, as after a lost reply). So whatever it did for a
        caller that is gone can be undone.

        Returns the result, or None if it did not finish in time; raises what it raised.
        """
        if self._tg is None or self._closed:
            raise ClosedError("the session is not open")
        box: list[Any] = []
        done = anyio.Event()
        abandoned = False

        def undo_now() -> None:
            if undo is not None:
                undo(None if not box or isinstance(box[0], _Failed) else box[0])

        async def run() -> None:
            try:
                box.append(await func())
            except Exception as exc:
                box.append(_Failed(exc))
            finally:
                done.set()
                # Checked with no checkpoint since the outcome arrived: either the caller
                # takes it, or it has gone and the outcome is undone here (also when
                # this task is cancelled with the session: no outcome, unknown).
                if abandoned:
                    undo_now()

        self._tg.start_soon(run)
        try:
            with anyio.move_on_after(self._ttl, shield=shield):
                await done.wait()
        except BaseException:
            if done.is_set() and box:
                undo_now()
            else:
                abandoned = True
            raise
        if not box:
            abandoned = True
            return None
        if isinstance(box[0], _Failed):
            raise box[0].error
        return box[0]  # type: ignore[no-any-return]

    def discard(self, entry: Entry) -> None:
        """Delete a waiter entry that nobody holds, in a task of the session, at once and
        guaranteed (retried while the session lives). Not a checkpoint: a cancelled
        acquire returns without waiting for the store (a timeout stays a timeout even
        when the store is unreachable), and a thousand of them do not wait in shielded
        scopes (which anyio would keep re-cancelling, starving the event loop)."""
        if self._tg is not None and not self._closed and not self.lost:
            self._tg.start_soon(self._delete_until_done, entry, [], anyio.Event())

    async def _delete_until_done(
        self, entry: Entry, outcome: list[bool], done: anyio.Event
    ) -> None:
        assert self._in_flight is not None
        try:
            for attempt in _retry.attempts():
                try:
                    async with self._in_flight:
                        outcome.append(await self._backend.delete(entry))
                    return
                except SessionExpiredError:
                    self.declare_lost("the store no longer knows the session's lease")
                    return
                except BackendError as exc:
                    if self.lost:
                        return
                    if attempt == 3:
                        _log.warning("coord: deleting %s keeps failing: %s", entry.key, exc)
                    await _retry.backoff(attempt)
        finally:
            done.set()


class _Failed:
    def __init__(self, error: Exception) -> None:
        self.error = error


class _Registration:
    """One registration request and its outcome, owned by a task of the session."""

    def __init__(
        self,
        prefix: str,
        waiter_id: str,
        lease: Lease,
        value: bytes,
        ahead: int | None,
        kind: str | None,
        retry: bool,
        durable: bool = False,
    ) -> None:
        self.durable = durable
        self.prefix = prefix
        self.kind = kind
        self.waiter_id = waiter_id
        self.lease = lease
        self.value = value
        self.ahead = ahead
        self.retry = retry
        self.position: Position | None = None
        self.error: Exception | None = None
        self.abandoned = False
        self.on_abandon: Callable[[Entry | None], None] | None = None
        self.done = anyio.Event()

    async def run(self, session: Session) -> None:
        try:
            self.position = await self._attempts(session)
        except SessionExpiredError as exc:
            session.declare_lost("the store refused a registration on the session's lease")
            self.error = exc
        except EntryGoneError as gone:
            # Its lease expired under it, or someone deleted it.
            lost = SessionExpiredError(f"the session was lost ({session.reason})")
            self.error = lost if session.lost else gone
        except Exception as exc:
            self.error = exc
        finally:
            # Set and checked with no checkpoint in between: the caller either sees the
            # position (and deletes it itself) or has abandoned it before this point.
            self.done.set()
            orphan = self.abandoned or self.error is not None
            if self.on_abandon is not None and self.abandoned:
                # Also when this task is cancelled with the session: the request may
                # have reached the store, and what it made outlives the session.
                self.on_abandon(self.position.entry if self.position else None)
        if self.on_abandon is not None:
            return
        if orphan and not session.lost:
            lease_id = 0 if self.durable else self.lease.id
            provisional = Entry(self.prefix + self.waiter_id, lease=lease_id)
            session.discard(self.position.entry if self.position else provisional)

    async def _attempts(self, session: Session) -> Position:
        backend = session.backend
        assert session._in_flight is not None
        for attempt in _retry.attempts():
            try:
                async with session._in_flight:
                    return await backend.register(
                        self.prefix,
                        self.waiter_id,
                        None if self.durable else self.lease,
                        value=self.value,
                        ahead=self.ahead,
                        kind=self.kind,
                    )
            except BackendUnavailable as exc:
                # The same waiter id again: a request that did reach the store is found
                # and returned, not registered twice.
                if session.lost:
                    raise SessionExpiredError(f"the session was lost ({session.reason})") from exc
                if not self.retry or self.abandoned:
                    raise
                await _retry.backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover
