"""Work a session owns: registrations, guarded deletes and settles of writes.

Registrations and settles run in a task of the session, which owns their outcome; the
caller only waits for it. An anyio shield does not stop a native asyncio cancellation
(``task.cancel()``, ``asyncio.timeout``), so a cleanup awaited by the caller itself could
be cut short and leave a key behind; a cleanup owned by the session cannot. A caller that
goes away leaves the task to delete (or undo) what the request made, once its reply is
in. A delete (a release) is made by the caller's task, which spares a task and a loop
turn per release; whatever cuts it short (a native cancellation, the TTL) hands it to a
task of the session at once, which repeats it until it is done.

:class:`OwnedWork` is what :class:`coord._sessions.session.Session` is made of besides the
lease's life: it needs only the session's task group, its lease and its loss.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.background import declare_asyncio
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    EntryGoneError,
    SessionExpiredError,
)
from ..abc import Entry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from ..abc import Backend, Lease, Position

__all__ = ["IN_FLIGHT", "OwnedWork"]

_T = TypeVar("_T")

_log = logging.getLogger("coord")

# Registrations and deletes one session has in flight at a time. A burst of thousands
# of acquires (or of cancellations) would otherwise send thousands of requests at once:
# on ZooKeeper each registration reads the whole queue on the session's single
# connection, on etcd each is a gRPC call on the event loop; either way the lease's own
# keepalive then waits behind them long enough to lose the session. A few dozen at a time
# keep the line short and the store just as busy.
IN_FLIGHT = 32


class OwnedWork(ABC):
    """Registrations, deletes and settles run in tasks of a session."""

    #: Why the session was lost (None while it is not).
    reason: str | None

    @property
    @abstractmethod
    def backend(self) -> Backend: ...

    @property
    @abstractmethod
    def ttl(self) -> float: ...

    @property
    @abstractmethod
    def lost(self) -> bool: ...

    @property
    @abstractmethod
    def running(self) -> bool:
        """True from ``__aenter__`` until the session is closed."""

    @property
    @abstractmethod
    def in_flight(self) -> anyio.Semaphore:
        """Bounds the registrations and deletes in flight (:data:`IN_FLIGHT`)."""

    @abstractmethod
    def check(self) -> Lease: ...

    @abstractmethod
    def _ended(self) -> ClosedError | SessionExpiredError:
        """What a use of the session raises once it cannot be used: SessionExpiredError
        once it is lost (closed since or not), ClosedError if it is not open or was
        closed while live (see :meth:`coord._sessions.session.Session._ended`)."""

    @abstractmethod
    def start_soon(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None: ...

    @abstractmethod
    def start_ending(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None: ...

    @abstractmethod
    def declare_lost(self, reason: str) -> None: ...

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
        if on_abandon is None and not durable and self.backend.cheap_abandon:
            return await request.here(self)
        request.on_abandon = on_abandon
        request.done = anyio.Event()
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
        if request.position is None:  # the session's tasks were cancelled: it closed
            raise self._ended()
        return request.position

    async def delete(self, entry: Entry) -> bool | None:
        """Delete *entry*, guarded by its creation revision.

        Made by the caller's task (a task of the session would cost a task and a loop
        turn per release), shielded from anyio cancellation and bounded by the TTL:
        True if deleted, False if it was not there, None if not known (the store did not
        answer in time: a task of the session keeps trying in the background while the
        session lives, CURATOR-678; or the session is lost, and the entry with it). A
        native asyncio cancellation, which no anyio shield stops, ends the caller's
        attempt and not the delete: a task of the session takes it over at once.
        """
        if not self.running or self.lost:
            return None
        outcome: list[bool] = []
        try:
            with anyio.move_on_after(self.ttl, shield=True):
                await self._delete_until_done(entry, outcome)
        except ClosedError:
            return None  # the session was closed meanwhile (its lease revoked)
        finally:
            if not outcome:  # cancelled, timed out, or lost or closed (then a no-op)
                self.discard(entry)
        return outcome[0] if outcome else None

    async def settle(
        self,
        func: Callable[[], Awaitable[_T]],
        *,
        undo: Callable[[_T | None], None] | None = None,
        shield: bool = True,
        ending: bool = False,
    ) -> _T | None:
        """Await ``func()`` in a task of the session, which owns its outcome: a native
        asyncio cancellation of the caller stops the wait, not the work. Waits bounded by
        the TTL, and shielded from anyio cancellation unless *shield* is False (then an
        anyio cancellation, too, stops the wait and not the work).

        If the caller goes away (cancelled, or the TTL passed) *undo* is called when the
        work ends: with its result, or with None if it raised or was cancelled with the
        session (its outcome is unknown, as after a lost reply). So whatever it did for a
        caller that is gone can be undone. With *ending*, the session's close waits for
        the task (and what its undo starts) before it revokes the lease, up to the TTL
        (``Session.start_ending``): a cancelled claim still out when the client closes.

        Returns the result, or None if it did not finish in time; raises what it raised.

        :raises SessionExpiredError: if the session was lost and closed before the call
        :raises ClosedError: if it is not open, or was closed while live
        """
        if not self.running:
            raise self._ended()
        box: list[Any] = []
        done = anyio.Event()
        abandoned = False

        def undo_now() -> None:
            if undo is not None:
                undo(None if not box or isinstance(box[0], _Failed) else box[0])

        async def run() -> None:
            declare_asyncio()  # (coord's work alone: see Session.settle's callers)
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

        (self.start_ending if ending else self.start_soon)(run)
        try:
            with anyio.move_on_after(self.ttl, shield=shield):
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
        if self.running and not self.lost:
            self.start_soon(partial(self._delete_until_done, entry, []))

    async def _delete_until_done(self, entry: Entry, outcome: list[bool]) -> None:
        """Delete *entry*, again after each failure while the session lives; its outcome
        (deleted, or not there) goes to *outcome*. Not there after an attempt whose
        outcome is unknown (no answer) counts as deleted: that attempt may have done it,
        as a backend's own repeat counts it."""
        unknown = False
        for attempt in _retry.attempts():
            try:
                async with _Slot(self.in_flight):
                    outcome.append(await self.backend.delete(entry) or unknown)
                return
            except SessionExpiredError:
                self.declare_lost("the store no longer knows the session's lease")
                return
            except BackendError as exc:
                unknown = unknown or isinstance(exc, BackendUnavailable)
                if self.lost or not self.running:
                    return
                if attempt == 3:
                    _log.warning("deleting %s keeps failing: %s", entry.key, exc)
                await _retry.backoff(attempt)


class _Slot:  # used as a function: ``async with _Slot(semaphore)``
    """``async with in_flight``, without the checkpoint of a free slot: these tasks are
    the session's, checkpointed by the request they make, and anyio's acquire yields to
    the event loop even when it does not wait (two loop turns per acquisition)."""

    __slots__ = ("_in_flight",)

    def __init__(self, in_flight: anyio.Semaphore) -> None:
        self._in_flight = in_flight

    async def __aenter__(self) -> None:
        try:
            self._in_flight.acquire_nowait()
        except anyio.WouldBlock:
            await self._in_flight.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._in_flight.release()


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
        #: A request went to the backend (until then, nothing can have been made).
        self.sent = False
        self.on_abandon: Callable[[Entry | None], None] | None = None
        self.done: anyio.Event  # set by the caller that waits for run()

    async def here(self, session: OwnedWork) -> Position:
        """Register in the caller's task, on a backend that undoes a registration cut
        short as cheaply as one that answered (:attr:`coord.abc.Backend.cheap_abandon`):
        whatever ends it without a position (an error, any cancellation) has a task of
        the session delete what it may have made, at once."""
        try:
            return await self._attempts(session)
        except SessionExpiredError:
            session.declare_lost("the store refused a registration on the session's lease")
            raise
        except EntryGoneError as gone:  # its lease expired under it, or someone deleted it
            self._undo(session)
            if session.lost:
                raise SessionExpiredError(f"the session was lost ({session.reason})") from gone
            raise
        except BaseException:
            self._undo(session)
            raise

    def _undo(self, session: OwnedWork) -> None:
        # Not sent (e.g. cancelled while waiting for a request slot): nothing to find,
        # and a search for it would cost a read of the queue (a listing on etcd).
        if self.sent and not session.lost:
            session.discard(Entry(self.prefix + self.waiter_id, lease=self.lease.id))

    async def run(self, session: OwnedWork) -> None:
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

    async def _attempts(self, session: OwnedWork) -> Position:
        backend = session.backend
        for attempt in _retry.attempts():
            try:
                async with _Slot(session.in_flight):
                    self.sent = True
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
