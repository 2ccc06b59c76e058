"""Owner: one member's share of a partitioner's partitions, and the work done under them.

Every partition is a lock (``<name>/_partitions/<p>``, :class:`PartitionLock`): its owner
is the holder, so that at most one member owns a partition whatever the members believe,
a partition is taken only once its previous owner released it or lost its session, and
its fence is the lock's (strictly increasing from owner to owner). The assignment only
says who should queue for which lock (:mod:`coord._partitioner`).

A partition given to this member is kept by a task of the owner (:meth:`Owner._keep`):
it acquires the lock, then waits until the partition is taken away (a new assignment,
the end of the membership) or lost (the session, the key). Work on a partition runs in
``async with owner.partition(p)``: a scope that is cancelled when the partition goes.
Taken away, the partition is released only after every such block has ended, so that
the next owner starts after this one stopped; lost, its blocks are cancelled as soon as
the loss is known, which the lease's local deadline makes sure is before the store lets
another member take it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._assign import partition_of
from ._exceptions import ClosedError, PartitionLost, SessionExpiredError
from ._hold import Hold
from ._keys import new_waiter_id_of
from ._locking import TaskLock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

    from ._assign import Record
    from ._group import Membership
    from ._session import SessionSource

__all__ = ["Assignment", "Owner", "OwnerStatistics", "PartitionHold", "PartitionLock"]

_log = logging.getLogger("coord")


def lock_name(name: str, partition: int) -> str:
    """The name of the lock of *partition* of the partitioner *name*."""
    return f"{name}/_partitions/{partition}"


class PartitionHold(Hold):
    """This member's ownership of one partition: what ``async with owner.partition(p)``
    returns.

    :ivar fence: strictly increasing from owner to owner of this partition
    """

    _lost_error = PartitionLost

    def __repr__(self) -> str:
        state = "lost" if self.lost else "released" if self.released else "owned"
        return f"<coord.PartitionHold {self.name!r} fence={self.fence} {state}>"

    @property
    def partition(self) -> int:
        """The partition's number."""
        return int(self.name.rpartition("/")[2])


class PartitionLock(TaskLock):
    """The lock whose holder owns one partition (not counted as a lock acquire)."""

    _what = "partition"
    _hold_type = PartitionHold
    _counted = False


@dataclass(frozen=True)
class Assignment:
    """The partitions this member owns now: what :meth:`Owner.assignments` yields.

    :ivar owned: the partitions whose lock this member holds now
    :ivar fences: each owned partition's fence
    :ivar assigned: the partitions the assignment gives this member, owned or not yet
        (a partition is owned once its previous owner let it go)
    :ivar generation: the generation of the assignment it comes from (strictly
        increasing; 0 before the first)
    """

    owned: frozenset[int]
    fences: Mapping[int, int] = field(hash=False)
    assigned: frozenset[int]
    generation: int

    def fence(self, partition: int) -> int:
        """The fence of an owned *partition*.

        :raises KeyError: if it is not owned in this assignment
        """
        return self.fences[partition]


@dataclass(frozen=True)
class OwnerStatistics:
    """What one member of a partitioner did (this process only): see
    :meth:`Owner.statistics`.

    :ivar name: the partitioner's name
    :ivar owned: how many partitions it owns now
    :ivar assigned: how many the assignment gives it now, owned or not yet
    :ivar generation: the generation of the assignment it follows (0 before the first)
    :ivar taken: partitions it came to own since it joined
    :ivar released: partitions it let go (taken away by an assignment, or leaving)
    :ivar lost: partitions lost while owned (the session, the key)
    """

    name: str
    owned: int
    assigned: int
    generation: int
    taken: int
    released: int
    lost: int


class _Part:
    """The state of one partition given to this member."""

    def __init__(self, number: int, changed: Callable[[], None]) -> None:
        self.number = number
        self._changed = changed
        self.hold: PartitionHold | None = None
        self.acquiring = anyio.CancelScope()  # cancelled to give up a pending acquire
        self.waiting = anyio.CancelScope()  # cancelled when it goes (taken away or lost)
        self.why: str | None = None  # why it goes
        self.bodies: set[anyio.CancelScope] = set()
        self.idle = anyio.Event()
        self.idle.set()

    @property
    def usable(self) -> bool:
        return self.hold is not None and self.why is None and not self.hold.lost

    def end(self, why: str) -> None:
        """Take it away: cancel the pending acquire, or the wait and every block."""
        if self.why is None:
            self.why = why
            self._changed()
        self.acquiring.cancel()  # (an acquire may still return a hold: see _keep)
        self.waiting.cancel()
        for scope in self.bodies:
            scope.cancel()

    def poke(self) -> None:
        """News about the hold: cancel everything at once if it is lost."""
        if self.hold is not None and self.hold.lost:
            self.end(f"it was lost ({self.hold._why()})")


class Owner:
    """This member's share of a partitioner's partitions: what ``async with
    partitioner.join() as owner`` returns. See :class:`coord.Partitioner`."""

    def __init__(self, source: SessionSource, name: str, partitions: int) -> None:
        self._source = source
        self._name = name
        self._partitions = partitions
        self.membership: Membership | None = None  # set when joined
        self.record: Record | None = None  # the newest assignment read
        self._parts: dict[int, _Part] = {}
        self._version = 0
        self._event = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._ended = False
        self._counts = {"taken": 0, "released": 0, "lost": 0}

    def __repr__(self) -> str:
        owned = sorted(p for p, part in self._parts.items() if part.usable)
        return f"<coord.Owner {self._name!r} owned={owned}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def id(self) -> str:
        """This member's id in the group (see :attr:`coord.Member.id`)."""
        assert self.membership is not None
        return self.membership.id

    def partition_of(self, key: str | bytes) -> int:
        """The partition of *key*: see :meth:`coord.Partitioner.partition_of`."""
        return partition_of(key, self._partitions)

    @property
    def assignment(self) -> Assignment:
        """What this member owns now. Not a checkpoint."""
        owned = {p: part.hold.fence for p, part in self._parts.items() if part.hold and part.usable}
        generation = self.record.generation if self.record is not None else 0
        return Assignment(frozenset(owned), owned, frozenset(self._parts), generation)

    def statistics(self) -> OwnerStatistics:
        """What this member owns and did since it joined. Not a checkpoint."""
        assignment = self.assignment
        return OwnerStatistics(
            self._name,
            len(assignment.owned),
            len(assignment.assigned),
            assignment.generation,
            **self._counts,
        )

    def assignments(self) -> AsyncIterator[Assignment]:
        """Follow what this member owns: ``async for assignment in owner.assignments():``.

        Yields the current :class:`Assignment` first (empty until the first partition is
        owned), then a new one at every change: a partition owned (its previous owner let
        it go), taken away or lost. Changes that come together may be yielded as one;
        never the same assignment twice in a row. Each step is a checkpoint. Ends with
        the membership (its block is cancelled).
        """
        return _Assignments(self)

    def partition(self, partition: int) -> AbstractAsyncContextManager[PartitionHold]:
        """Work on an owned partition: ``async with owner.partition(p) as hold:``.

        The block runs only while this member owns *partition*: it is cancelled when the
        partition is taken away (a rebalance, leaving the group) or lost (the session,
        the key), and then raises :exc:`coord.PartitionLost`. A partition taken away is
        released only after every block on it has ended, so its next owner starts after
        this one stopped. Send ``hold.fence`` with every write made for the partition:
        it strictly increases from owner to owner. Any number of tasks may work on one
        partition at once. Entering is a checkpoint.

        :raises PartitionLost: at once if this member does not own *partition* now
        """
        return _Block(self, partition)

    # -- the owner's tasks ------------------------------------------------------------------

    def _changed(self) -> None:
        self._version += 1
        self._event.set()
        self._event = anyio.Event()

    def _apply(self, record: Record) -> None:
        """Follow a new assignment: queue for the partitions it gives me, let go of the
        others."""
        self.record = record
        assert self.membership is not None
        assert self._tg is not None
        if self._ended:
            return
        mine = record.of(new_waiter_id_of(self.membership.key))
        for number in self._parts.keys() - mine:
            moved = f"it was moved to another member (generation {record.generation})"
            self._parts[number].end(moved)
        for number in sorted(mine):
            self._take(number)
        self._changed()

    def _take(self, number: int) -> None:
        """Queue for partition *number*, unless a part of it is kept and not going (one
        that is going, given back meanwhile, is queued for again: behind its own key)."""
        part = self._parts.get(number)
        if part is not None and part.why is None:
            return
        assert self._tg is not None
        part = self._parts[number] = _Part(number, self._changed)
        self._tg.start_soon(self._keep, part)

    def _end(self, why: str) -> None:
        """Let go of every partition (the membership ends)."""
        self._ended = True
        for part in self._parts.values():
            part.end(why)
        self._changed()

    async def _keep(self, part: _Part) -> None:
        """Own *part* until it is taken away or lost; release it once its blocks ended."""
        lock = PartitionLock(self._source, lock_name(self._name, part.number))
        hold: Hold | None = None
        try:
            with part.acquiring:
                hold = await lock.acquire()
        except (SessionExpiredError, ClosedError):
            pass  # the session or the client ended: the membership goes with it
        if hold is None:
            self._forget(part)
            return
        assert isinstance(hold, PartitionHold)
        part.hold = hold
        unfollow = hold._follow(part.poke)
        self._counts["taken"] += 1
        _log.debug("coord: %s: partition %d owned (fence %d)", self._name, part.number, hold.fence)
        self._changed()
        try:
            if part.why is None:  # (taken away while its acquire returned: no wait)
                with part.waiting:
                    await anyio.sleep_forever()
            await part.idle.wait()  # taken away: its blocks stop before the release
        finally:
            part.end("the member left the group")
            unfollow()
            if part.bodies:  # cancelled itself: still let the blocks see it first
                with anyio.CancelScope(shield=True), anyio.move_on_after(hold.session.ttl):
                    await part.idle.wait()
            self._forget(part)
            lost = hold.lost
            try:
                await lock.release()  # the delete runs in a task of the session
            except (SessionExpiredError, ClosedError) as exc:  # LockLost included
                lost = True
                _log.info("coord: %s", exc)
            else:
                _log.debug("coord: %s: partition %d let go: %s", self._name, part.number, part.why)
            self._counts["lost" if lost else "released"] += 1
            if lost and not hold.session.lost:
                self._again(part.number)  # its key was deleted: queue for it again

    def _again(self, number: int) -> None:
        """Queue again for a partition lost while the session lives (its key deleted by
        someone else), if the assignment still gives it to this member."""
        membership, record = self.membership, self.record
        if self._ended or membership is None or membership.lost or record is None:
            return
        if number in record.of(new_waiter_id_of(membership.key)):
            self._take(number)
            self._changed()

    def _forget(self, part: _Part) -> None:
        if self._parts.get(part.number) is part:
            del self._parts[part.number]
        self._changed()


class _Block:
    """``async with owner.partition(p)``: a scope cancelled when the partition goes."""

    def __init__(self, owner: Owner, number: int) -> None:
        self._owner = owner
        self._number = number
        self._part: _Part | None = None
        self._scope: anyio.CancelScope | None = None

    async def __aenter__(self) -> PartitionHold:
        await anyio.lowlevel.checkpoint()
        part = self._owner._parts.get(self._number)
        if part is None or not part.usable:
            why = part.why if part is not None and part.why else "it is not owned now"
            raise PartitionLost(
                f"partition {self._number} of {self._owner.name!r} is not this member's: {why}"
            )
        assert part.hold is not None
        self._part, self._scope = part, anyio.CancelScope()
        if not part.bodies:
            part.idle = anyio.Event()
        part.bodies.add(self._scope)
        self._scope.__enter__()
        return part.hold

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        part, scope = self._part, self._scope
        assert part is not None
        assert scope is not None
        assert part.hold is not None
        try:
            swallowed = bool(scope.__exit__(exc_type, exc_val, exc_tb))
        finally:
            part.bodies.discard(scope)
            if not part.bodies:
                part.idle.set()
        if part.hold.lost or part.why is not None:
            raise PartitionLost(
                f"partition {self._number} of {self._owner.name!r} went while worked on "
                f"(fence {part.hold.fence}): {part.why or 'it was lost'}"
            )
        return swallowed


class _Assignments:
    """The iterator behind :meth:`Owner.assignments`."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._seen = -1
        self._last: Assignment | None = None

    def __aiter__(self) -> _Assignments:
        return self

    async def __anext__(self) -> Assignment:
        owner = self._owner
        await anyio.lowlevel.checkpoint()
        while True:
            while self._seen == owner._version:
                if owner._ended and not owner._parts:
                    raise StopAsyncIteration  # the membership ended
                await owner._event.wait()
            self._seen = owner._version
            assignment = owner.assignment
            if assignment != self._last:
                self._last = assignment
                return assignment
