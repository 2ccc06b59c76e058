"""Mutex: a fair-queue distributed lock with fencing tokens.

The algorithm of etcd's ``concurrency.Mutex`` and Curator's ``InterProcessMutex``, written
against :class:`coord.abc.Backend` only:

1. *register*: one request creates my waiter entry (bound to the session's lease, a fresh
   id per acquire) and reads the nearest entry ahead of it;
2. *wait*: while an entry is ahead, wait for the deletion of that one entry (or of mine),
   then re-read my position, which also checks that my entry still exists (etcd #11456);
   only the immediate predecessor is watched, so a release wakes exactly one waiter;
3. *hold*: my entry's creation revision is the fencing token; a background watch on my
   own entry and the session's loss signal cancel the body of ``async with`` if the lock
   is lost, and ``LockLost`` is raised;
4. *release*: delete my entry only if it is still mine (etcd #22082), shielded and
   bounded by the TTL, retried in the background if it fails (CURATOR-678).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
from anyio import get_current_task
from anyio.lowlevel import checkpoint_if_cancelled

from . import _keys
from ._exceptions import (
    BackendUnavailable,
    EntryGoneError,
    LockedError,
    LockLost,
    NotOwnerError,
    SessionExpiredError,
)
from ._hold import Hold
from .abc import Entry, Position

if TYPE_CHECKING:
    from types import TracebackType

    from ._session import Session

__all__ = ["Mutex", "MutexStatistics"]


@dataclass(frozen=True)
class MutexStatistics:
    """Local state of one :class:`Mutex` object (this process only).

    :ivar name: the mutex name
    :ivar locked: whether a task of this process holds it through this object
    :ivar fence: the holder's fencing token, or None
    :ivar tasks_waiting: tasks of this process waiting in ``acquire``
    """

    name: str
    locked: bool
    fence: int | None
    tasks_waiting: int


class Mutex:
    """A distributed mutex: strict FIFO, no herd, fenced, and loud when lost.

    Example::

        async with coord.connect("etcd://127.0.0.1:2379") as client:
            async with client.mutex("orders/42") as hold:
                await write_order(fence=hold.fence)

    Every acquire registers its own waiter key, so any number of tasks may share one
    Mutex object (and one session). Not reentrant: a task that already holds this Mutex
    object gets an error instead of a deadlock. Timeouts are cancel scopes::

        with anyio.fail_after(5):
            async with mutex: ...

    :param session: the session whose lease the waiter keys are bound to
    :param name: slash-separated name, e.g. ``"orders/42"``
    """

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self._name = _keys.check_name(name)
        self._prefix = _keys.prefix_of(name)
        self._holds: dict[int, Hold] = {}
        self._waiting = 0

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<coord.Mutex {self._name!r} locked={self.locked()}>"

    def locked(self) -> bool:
        """Whether a task of this process holds the lock through this object.

        Local state only: says nothing of other processes. Not a checkpoint.
        """
        return bool(self._holds)  # a hold leaves this dict when it is released

    def statistics(self) -> MutexStatistics:
        """Return the local state of this object. Not a checkpoint."""
        hold = next(iter(self._holds.values()), None)
        return MutexStatistics(
            self._name, hold is not None, hold.fence if hold else None, self._waiting
        )

    # -- acquire --------------------------------------------------------------------------

    async def acquire(self) -> Hold:
        """Wait for the lock in FIFO order and return the :class:`Hold`.

        A checkpoint. If cancelled (or if it raises), this call did not happen: the waiter
        key is deleted (shielded, bounded by the TTL) before the exception propagates; if
        the cancel lands while the registration request is in flight, the session task
        that owns the request deletes the key when its reply arrives.

        :raises SessionExpiredError: if the session is lost while waiting, or my waiter
            key is deleted by someone else
        :raises LockedError: if this task already holds this mutex (not reentrant)
        """
        self._check_not_held()
        self._waiting += 1
        try:
            position = await self._register()
            hold = self._guarded(position)
            try:
                with hold._cancelled_on_loss():
                    while not position.is_head:
                        await self._session.backend.wait_deleted(
                            [position.ahead[0].key], revision=position.revision
                        )
                        position = await self._session.backend.position(position.entry)
            except EntryGoneError:
                hold._mark_lost()
            except BaseException:
                hold._release()
                await self._discard(position.entry)
                raise
            if hold.lost:
                hold._release()
                raise SessionExpiredError(
                    f"my waiter key for {self._name!r} was deleted while waiting "
                    "(session lost, or key deleted by another client)"
                )
            self._holds[get_current_task().id] = hold
            return hold
        finally:
            self._waiting -= 1

    async def try_acquire(self) -> Hold:
        """Take the lock if nobody holds or waits for it, else raise at once.

        A checkpoint; one round trip, or two when the lock is taken (the key is removed).

        :raises LockedError: if someone else holds or waits for the lock
        """
        self._check_not_held()
        position = await self._register()
        if not position.is_head:
            await self._discard(position.entry)
            raise LockedError(f"mutex {self._name!r} is locked")
        hold = self._guarded(position)
        self._holds[get_current_task().id] = hold
        return hold

    async def _register(self) -> Position:
        """Register a waiter key; a cancelled call leaves no key behind.

        The request runs in a task of the session, which owns its outcome: if we are
        cancelled while it is in flight, we return at once and that task deletes the key
        when the request completes (bounded by the TTL). Deleting right away could reach
        the store before the request itself and leave the key behind.
        """
        await checkpoint_if_cancelled()  # already cancelled: register nothing at all
        lease = self._session.check()
        outcome = _Registration(self._prefix, _keys.new_waiter_id(), lease.id)
        self._session.start_soon(lambda: outcome.run(self._session))
        try:
            await outcome.done.wait()
        except BaseException:
            if outcome.done.is_set() and outcome.position is not None:
                await self._discard(outcome.position.entry)  # it arrived: ours to delete
            else:
                outcome.abandoned = True  # the task deletes it when the reply comes
            raise
        if outcome.error is not None:
            raise outcome.error
        if outcome.position is None:
            raise BackendUnavailable(f"registering a waiter for {self._name!r} timed out")
        return outcome.position

    def _guarded(self, position: Position) -> Hold:
        # One guard per waiter key, from registration to release: it watches my own key
        # (and the session) while I wait and while I hold, so waiting needs to watch only
        # the predecessor.
        hold = Hold(self._name, position.entry, revision=position.revision)
        self._session.start_soon(lambda: hold._guard(self._session))
        return hold

    async def _discard(self, entry: Entry) -> None:
        if not self._session.lost:
            await self._session.discard(entry)

    def _check_not_held(self) -> None:
        if get_current_task().id in self._holds:
            raise LockedError(
                f"this task already holds mutex {self._name!r} (coord mutexes are not reentrant)"
            )

    # -- release --------------------------------------------------------------------------

    async def release(self) -> None:
        """Release the lock held by the current task.

        The delete is shielded and bounded by the TTL, and retried in the background if
        it fails; cancelling this call does not undo the release.

        :raises NotOwnerError: if the current task does not hold this mutex
        :raises LockLost: if the lock had been lost before this release
        """
        hold = self._holds.pop(get_current_task().id, None)
        if hold is None:
            raise NotOwnerError(f"mutex {self._name!r} is not held by this task")
        hold._release()
        if hold.lost:  # the key is gone already (or dies with the session)
            raise LockLost(f"mutex {self._name!r} was lost while held (fence {hold.fence})")
        await self._discard(hold.entry)

    # -- async with -----------------------------------------------------------------------

    async def __aenter__(self) -> Hold:
        hold = await self.acquire()
        hold._enter_body()
        return hold

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        hold = self._holds.get(get_current_task().id)
        if hold is None:
            raise NotOwnerError(f"mutex {self._name!r} is not held by this task")
        swallowed = hold._exit_body(exc_type, exc_val, exc_tb)
        # Raises LockLost if the lock was lost (the body's exception becomes its context);
        # otherwise the body's own exception propagates untouched.
        await self.release()
        return swallowed


class _Registration:
    """One registration request and its outcome, owned by a task of the session."""

    def __init__(self, prefix: str, waiter_id: str, lease_id: int) -> None:
        self.prefix = prefix
        self.waiter_id = waiter_id
        self.provisional = Entry(prefix + waiter_id, lease=lease_id)
        self.position: Position | None = None
        self.error: Exception | None = None
        self.abandoned = False
        self.done = anyio.Event()

    async def run(self, session: Session) -> None:
        try:
            with anyio.move_on_after(session.ttl):
                self.position = await session.backend.register(
                    self.prefix, self.waiter_id, session.lease
                )
        except Exception as exc:
            self.error = exc
        finally:
            # Set and checked with no checkpoint in between: the caller either sees the
            # position (and deletes it itself) or has abandoned it before this point.
            self.done.set()
            abandoned = self.abandoned
        if abandoned and not session.lost:
            await session.discard(self.position.entry if self.position else self.provisional)
