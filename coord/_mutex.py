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
4. *release*: delete my entry only if it is still mine (etcd #22082), in a task of the
   session (so that no cancellation can cut it short), retried in the background if it
   fails (CURATOR-678); a delete that finds nothing means the lock had been lost.

On a client (a :class:`~coord._keeper.SessionKeeper`) a waiter whose session is lost
held nothing: it registers again on the next session and keeps waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from anyio import get_current_task

from . import _keys
from ._exceptions import EntryGoneError, LockedError, NotOwnerError, SessionExpiredError
from ._hold import Hold

if TYPE_CHECKING:
    from types import TracebackType

    from ._session import Session, SessionSource

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

    :param session: where the waiter keys' lease comes from: a client's sessions (which
        renew) or one :class:`coord.Session`
    :param name: slash-separated name, e.g. ``"orders/42"``
    """

    def __init__(self, session: SessionSource, name: str) -> None:
        self._source = session
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

        A checkpoint. Waits through store outages and session losses: a request that
        fails is repeated while the session lives, and a waiter whose session is lost (or
        whose key is deleted) registers again on the next session, at the end of the
        queue. Bounded only by the caller's cancel scope.

        If cancelled, this call did not happen: nothing is held, and the waiter key is
        deleted by a task of the session at once (retried while the session lives, under
        anyio and native asyncio cancellation alike), without making the cancellation
        wait for the store; if the cancel lands while the registration request is in
        flight, that task deletes the key when its reply arrives.

        :raises SessionExpiredError: if the session is lost, or my waiter key deleted by
            someone else, and no new session follows (``renew=False``, or a bare Session)
        :raises LockedError: if this task already holds this mutex (not reentrant)
        """
        self._check_not_held()
        self._waiting += 1
        try:
            while True:
                session = await self._source.live()
                hold = await self._queue(session)
                if hold is not None:
                    self._holds[get_current_task().id] = hold
                    return hold
                if not self._source.renews:
                    raise SessionExpiredError(
                        f"my waiter key for {self._name!r} was deleted while waiting "
                        f"({session.reason or 'deleted by another client'})"
                    )
        finally:
            self._waiting -= 1

    async def _queue(self, session: Session) -> Hold | None:
        """Register on *session* and wait for my turn; None if my key or the session went
        meanwhile (nothing is held, nothing is left behind)."""
        try:
            position = await session.register(self._prefix)
        except (SessionExpiredError, EntryGoneError):
            return None  # the session is lost (the next one, if any), or the key went
        hold = Hold(self._name, session, position)
        backend = session.backend
        try:
            with hold._waiting():
                while not (position.is_head and not session.lease.interrupted):
                    if position.is_head:  # interrupted: grant nothing until it resumes
                        await session.lease.wait_resumed()
                    else:
                        ahead = [position.ahead[0].key]
                        wait = partial(backend.wait_deleted, ahead, revision=position.revision)
                        await session.retry(wait)
                    position = await session.retry(partial(backend.position, position.entry))
        except EntryGoneError:
            hold._key_gone()
        except SessionExpiredError:
            session.declare_lost("the store refused a request on the session's lease")
        except BaseException:
            hold._finish()
            session.discard(position.entry)
            raise
        if hold._gone or session.lost:
            hold._finish()
            session.discard(position.entry)
            return None
        hold._grant()
        return hold

    async def try_acquire(self) -> Hold:
        """Take the lock if nobody holds or waits for it, else raise at once.

        A checkpoint; one round trip, or two when the lock is taken (the key is removed).

        :raises LockedError: if someone else holds or waits for the lock
        :raises BackendUnavailable: if the store cannot be reached (nothing is left)
        :raises SessionExpiredError: if the session is lost and none follows
        """
        self._check_not_held()
        session = await self._source.live()
        position = await session.register(self._prefix, retry=False)
        if not position.is_head or session.lease.interrupted:
            await session.delete(position.entry)  # gone when this raises
            raise LockedError(f"mutex {self._name!r} is locked")
        hold = Hold(self._name, session, position)
        hold._grant()
        self._holds[get_current_task().id] = hold
        return hold

    def _check_not_held(self) -> None:
        if get_current_task().id in self._holds:
            raise LockedError(
                f"this task already holds mutex {self._name!r} (coord mutexes are not reentrant)"
            )

    # -- release --------------------------------------------------------------------------

    async def release(self) -> None:
        """Release the lock held by the current task.

        The delete runs in a task of the session: cancelling this call (anyio or native
        asyncio) does not stop it, and a failed delete is retried in the background. An
        anyio cancellation waits for it (shielded, bounded by the TTL).

        :raises NotOwnerError: if the current task does not hold this mutex
        :raises LockLost: if the lock had been lost before this release: the session was
            lost, the lease's deadline passed, or the key was gone (the delete found
            nothing)
        """
        hold = self._holds.pop(get_current_task().id, None)
        if hold is None:
            raise NotOwnerError(f"mutex {self._name!r} is not held by this task")
        await hold._end()

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
