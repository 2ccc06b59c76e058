"""Hold: what the holder of a lock has — its fencing token and the loss signal.

A Hold exists from the registration of its waiter key: while waiting it only watches that
key; once granted it is the lock. It is lost when

* its key is deleted by someone else: a guard watch on the key sees it. That watch costs
  two watch messages and a stream round trip, more than the whole of most waits and
  holds on a busy lock, so it starts only once the hold has existed for
  :data:`GUARD_DELAY` (from the revision at which the key was seen, so an earlier
  deletion is reported at once). The release's guarded delete tells in any case;
* its session is lost (the store expired or revoked the lease, the client closed it, or
  the lease's local deadline passed: read from the clock, so ``lost`` is true the moment
  the deadline passes, with no checkpoint), or
* the connection was interrupted after the grant (ZooKeeper SUSPENDED, by default),
  unless it excludes nobody (a group membership: :attr:`Hold._voided_by_interruption`).

Then the body of ``async with`` is cancelled and the release raises LockLost.
"""

from __future__ import annotations

from contextlib import suppress
from typing import TYPE_CHECKING

import anyio

from .._core import retry as _retry
from .._core.exceptions import (
    BackendError,
    ClosedError,
    EntryGoneError,
    LockLost,
    SessionExpiredError,
)
from .._core.keys import fence_of

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from .._core.deferred import Start
    from .._sessions.session import Session
    from ..abc import Entry, Position

__all__ = ["GUARD_DELAY", "Hold"]

#: Seconds a hold (waiting or granted) exists before its guard watch on its own key
#: starts: a key deleted by another client is noticed within this plus a round trip.
GUARD_DELAY = 1.0


class Hold:
    """A granted lock. Returned by ``acquire`` and by ``async with mutex as hold``.

    :ivar name: the lock's name
    :ivar fence: the fencing token: strictly increasing across successive holders of the
        same lock (from the etcd create revision, the ZooKeeper czxid of the waiter key;
        see :func:`coord._core.keys.fence_of`). Send it with every write to the protected
        resource so that it can reject a stale holder.
    """

    #: What a loss raises (elections raise LeadershipLost, a LockLost).
    _lost_error: type[LockLost] = LockLost
    #: Whether its acquire had to wait for someone ahead (for the statistics).
    _waited = False
    #: Whether an interruption of the connection (ZooKeeper SUSPENDED under
    #: ``suspended_is_lost``) voids it: yes for whatever excludes others (a lock, a
    #: leadership, a partition); a group membership excludes nobody and lasts as long as
    #: its entry and session do.
    _voided_by_interruption = True
    #: The fencing token of the key created at a revision (the etcd layout's is the
    #: revision itself, as Go's holders have it).
    _fence_of = staticmethod(fence_of)

    def __init__(self, name: str, session: Session, position: Position) -> None:
        entry = position.entry
        self._setup(name, self._fence_of(entry.revision), session, entry)
        # My key existed at the read's revision (an entry's revision is its creation
        # order, which the contract does not promise to be a store revision).
        self._seen_at = position.revision
        # First what raises on a session that is over (SessionExpiredError: the waiter
        # registers on the next one), so that nothing is left listening to it.
        self._guard_start: Start | None = session.call_after(GUARD_DELAY, self._arm)
        self._unlisten = session.listen(self._poke)

    def _setup(self, name: str, fence: int, session: Session, entry: Entry) -> None:
        self.name = name
        self.fence = fence
        self._session = session
        self._entry = entry
        self._gone = False
        self._granted = False
        self._epoch = 0
        self._frozen: bool | None = None  # lost or not, as it was at release
        self._lost_flag = False  # set once a granted hold is known lost
        self._lost_event: anyio.Event | None = None  # made by the first wait_lost()
        self._scope: anyio.CancelScope | None = None  # the wait, then the body
        self._guard_start = None  # the guard's deferred arming (see __init__)
        self._unguard: Callable[[], None] | None = None  # stops the armed guard
        self._followers: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "held"
        return f"<coord.Hold {self.name!r} fence={self.fence} {state}>"

    @property
    def key(self) -> str:
        """The waiter key (relative to the namespace) that holds the lock."""
        return self._entry.key

    @property
    def entry(self) -> Entry:
        """The waiter key as the store has it (:class:`coord.abc.Entry`): what a
        transaction guarded by this hold checks (see :func:`coord.fenced_put`)."""
        return self._entry

    @property
    def session(self) -> Session:
        """The session whose lease the key is bound to."""
        return self._session

    @property
    def lost(self) -> bool:
        """True once the lock is known lost, or must be presumed lost: the key was
        deleted, the session is lost, or the lease's local deadline has passed (no
        checkpoint needed: check it right before a write). After the release, whether
        it had been lost by then. Not a checkpoint."""
        if self._frozen is not None:
            return self._frozen
        return self._is_lost()

    @property
    def released(self) -> bool:
        """True once the hold has ended: released, or its block left (lost or not). Not a
        checkpoint."""
        return self._frozen is not None

    async def wait_lost(self) -> None:
        """Return when the lock is lost. A checkpoint; never returns if it is not lost."""
        if self._lost_event is None:
            self._lost_event = anyio.Event()  # most holds are never waited on: made here
        if self._lost_flag:
            self._lost_event.set()
        await self._lost_event.wait()

    def _set_lost(self) -> None:
        self._lost_flag = True
        if self._lost_event is not None:
            self._lost_event.set()

    # -- state ----------------------------------------------------------------------------

    def _is_lost(self) -> bool:
        if self._gone or self._session.lost:
            return True
        return (
            self._voided_by_interruption
            and self._granted
            and self._session.lease.interruptions != self._epoch
        )

    def _why(self) -> str:
        session = self._session
        if self._gone:
            return "its key was deleted by someone else"
        if session.lost:
            return f"the session was lost: {session.reason or 'its lease deadline passed'}"
        return "the connection to the store was interrupted"

    def _poke(self) -> None:
        """News from the session (loss, interruption) or about the key: cancel the body
        (or, while waiting, the wait) if the lock is lost."""
        for follower in list(self._followers):
            follower()
        if self._frozen is not None:
            return
        lost = self._is_lost()
        if lost and self._granted:
            self._set_lost()
        if lost and self._scope is not None:
            self._scope.cancel()

    def _follow(self, poke: Callable[[], None]) -> Callable[[], None]:
        """Call *poke* on every news this hold gets (a cohort's task holds follow the
        cohort's key); returns the function that stops it."""
        self._followers.append(poke)
        return lambda: self._followers.remove(poke) if poke in self._followers else None

    def _key_gone(self) -> None:
        self._gone = True
        self._poke()

    def _grant(self) -> None:
        """Become the holder (the caller checked that the lease is not interrupted)."""
        self._granted = True
        self._epoch = self._session.lease.interruptions

    def _finish(self) -> bool:
        """Stop watching; freeze and return whether the lock was lost."""
        if self._frozen is None:
            self._frozen = self._is_lost() if self._granted else self._gone
            if self._guard_start is not None:
                self._guard_start.cancel()  # a brief hold: its guard is never armed
            if self._unguard is not None:
                self._unguard()
                self._unguard = None
            self._unlisten()
        return self._frozen

    async def _end(self) -> None:
        """Release: delete the key (guarded by its creation revision, in a task of the
        session), or raise LockLost if the lock had been lost, on whichever path."""
        lost = self._finish()
        session = self._session
        if lost:
            session.discard(self._entry)  # it may still exist (an interruption)
            raise self._lost_error(
                f"{self.name!r} was lost while held (fence {self.fence}): {self._why()}"
            )
        deleted = await session.delete(self._entry)
        if deleted is False or (deleted is None and session.lost):
            self._frozen = True
            self._set_lost()
        if deleted is False:
            self._gone = True
            raise self._lost_error(
                f"{self.name!r} was lost while held (fence {self.fence}): its key was gone "
                "at the release"
            )
        if deleted is None and session.lost:
            raise self._lost_error(
                f"{self.name!r}: the session was lost before the release could be confirmed "
                f"(fence {self.fence}): {session.reason}"
            )

    # -- scopes ---------------------------------------------------------------------------

    def _waiting(self) -> anyio.CancelScope:
        """The scope to wait in: cancelled if the key or session goes. The caller sets
        ``_scope`` back to None once out of it (a plain scope, not a generator: a waiter's
        memory is mostly what it waits with)."""
        scope = self._scope = anyio.CancelScope()
        if self._gone or self._session.lost:
            scope.cancel()
        return scope

    def _enter_body(self) -> None:
        # The body of ``async with`` runs in this scope; losing the lock cancels it.
        self._scope = anyio.CancelScope()
        self._scope.__enter__()
        if self._is_lost():
            self._set_lost()
            self._scope.cancel()

    def _exit_body(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        body, self._scope = self._scope, None
        if body is None:
            return False
        swallowed = bool(body.__exit__(exc_type, exc_val, exc_tb))
        # (True means the body's exception was the loss's cancellation, swallowed: trio's
        # scope says True for a body that raised nothing as well.)
        return swallowed and exc_val is not None

    # -- the guard: my own key, watched while the hold lasts -------------------------------

    def _arm(self) -> None:
        """Guard my key (from the revision at which it was last seen): a record in the
        backend's watch table, no task. Called on the session's deferred-call task."""
        self._guard_start = None
        if self._frozen is not None or self._session.lost:
            return  # released before it was due: nothing to watch
        try:
            self._unguard = self._session.backend.guard(
                self._entry.key, revision=self._seen_at, on_change=self._guard_fired
            )
        except ClosedError:
            pass  # the backend is closing: the session tells everyone

    def _guard_fired(self) -> None:
        # My key may be gone, or the backend lost sight of it: re-read (rare: a task).
        self._unguard = None
        if self._frozen is None:
            # The session is over, or closing: it tells everyone.
            with suppress(ClosedError, SessionExpiredError):
                self._session.start_soon(self._recheck)

    async def _recheck(self) -> None:
        """Read my key again: gone means lost; there means guard it again. Runs in the
        session's task group (so it ends with the session)."""
        backend = self._session.backend
        attempt = 0
        while self._frozen is None:  # released meanwhile: nothing to check
            try:
                revision = (await backend.position(self._entry, ahead=0)).revision
            except EntryGoneError:
                self._key_gone()
                return
            except (SessionExpiredError, ClosedError):
                return  # the session tells everyone
            except BackendError:
                if self._session.lost:
                    return
                await _retry.backoff(attempt)
                attempt += 1
                continue
            self._seen_at = max(self._seen_at, revision)
            self._arm()
            return
