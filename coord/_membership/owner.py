"""Owner: one member's share of a partitioner's partitions.

Each partition is a lock (:mod:`coord._membership.partition`); the assignment only says who should
queue for which lock (:mod:`coord._membership.partitioner`). A partition given to this member is
kept by a task of the owner (:meth:`Owner._keep`): it acquires the lock, then waits
until the partition is taken away (a new assignment, the end of the membership) or lost
(the session, the key), and releases it once the work on it has ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._core.exceptions import ClosedError, SessionExpiredError
from .._core.keys import new_waiter_id_of
from .assignment import partition_of
from .partition import PartitionBlock, PartitionHold, PartitionLock, PartitionState, lock_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from contextlib import AbstractAsyncContextManager

    from .._locks.hold import Hold
    from .._sessions.session import SessionSource
    from .assignment import Record
    from .group import Membership

__all__ = ["Assignment", "Owner", "OwnerStatistics"]

_log = logging.getLogger("coord")


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


class Owner:
    """This member's share of a partitioner's partitions: what ``async with
    partitioner.join() as owner`` returns. See :class:`coord.Partitioner`."""

    def __init__(self, source: SessionSource, name: str, partitions: int) -> None:
        self._source = source
        self._name = name
        self._partitions = partitions
        self.membership: Membership | None = None  # set when joined
        self._record: Record | None = None  # the newest assignment read
        self._parts: dict[int, PartitionState] = {}
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
        generation = self._record.generation if self._record is not None else 0
        given = frozenset(p for p, part in self._parts.items() if part.why is None)
        return Assignment(frozenset(owned), owned, given, generation)

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
        """Work on a partition of this member: ``async with owner.partition(p) as hold:``.

        Entering waits, if the assignment gives *partition* to this member but its
        previous owner has yet to let it go, until this member owns it (the wait is
        woken by the acquire, never polls; cancelling it leaves nothing behind: the
        partition's lock is the owner's, not the block's). The block runs only while
        this member owns *partition*: it is cancelled when the partition is taken away
        (a rebalance, leaving the group) or lost (the session, the key), and then raises
        :exc:`coord.PartitionLost`. A partition taken away is released only after every
        block on it has ended, so its next owner starts after this one stopped. Send
        ``hold.fence`` with every write made for the partition: it strictly increases
        from owner to owner. Any number of tasks may work on one partition at once.
        Entering is a checkpoint.

        :raises PartitionLost: at once if the assignment, as this member last read it,
            does not give it *partition* (none does before the first one is read: see
            :meth:`assignments`); while waiting, if the partition is taken away or lost
            before it is owned
        """
        return PartitionBlock(self._parts, lambda: self._event, self._name, partition)

    # -- the owner's tasks ------------------------------------------------------------------

    def _changed(self) -> None:
        self._version += 1
        self._event.set()
        self._event = anyio.Event()

    def _apply(self, record: Record) -> None:
        """Follow a new assignment: queue for the partitions it gives me, let go of the
        others."""
        self._record = record
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
        part = self._parts[number] = PartitionState(number, self._changed)
        self._tg.start_soon(self._keep, part)

    def _end(self, why: str) -> None:
        """Let go of every partition (the membership ends)."""
        self._ended = True
        for part in self._parts.values():
            part.end(why)
        self._changed()

    async def _keep(self, part: PartitionState) -> None:
        """Own *part* until it is taken away or lost; release it once its blocks ended."""
        lock = PartitionLock(self._source, lock_name(self._name, part.number))
        hold: Hold | None = None  # (a PartitionHold)
        gone = False
        try:
            with part.acquiring:
                hold = await lock.acquire()
        except SessionExpiredError:
            # The session ended (the membership goes with it), or, on a client that
            # does not renew, my waiting key was deleted by someone else: queue again.
            gone = True
        except ClosedError:
            pass  # the client is closing
        if hold is None:
            self._forget(part)
            if gone and part.why is None:
                self._again(part.number)
            return
        assert isinstance(hold, PartitionHold)
        part.hold = hold
        unfollow = hold._follow(part.poke)
        self._counts["taken"] += 1
        _log.debug("%s: partition %d owned (fence %d)", self._name, part.number, hold.fence)
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
            except (SessionExpiredError, ClosedError):  # LockLost (logged by the lock) too
                lost = True
            else:
                _log.debug("%s: partition %d let go: %s", self._name, part.number, part.why)
            self._counts["lost" if lost else "released"] += 1
            if lost and not hold.session.lost:
                self._again(part.number)  # its key was deleted: queue for it again

    def _again(self, number: int) -> None:
        """Queue again for a partition lost while the session lives (its key deleted by
        someone else), if the assignment still gives it to this member."""
        membership, record = self.membership, self._record
        if self._ended or membership is None or membership.lost or record is None:
            return
        if number in record.of(new_waiter_id_of(membership.key)):
            self._take(number)
            self._changed()

    def _forget(self, part: PartitionState) -> None:
        if self._parts.get(part.number) is part:
            del self._parts[part.number]
        self._changed()


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
