"""One partition of a partitioner: its lock, its state in a member, and the blocks of
work done under it.

Every partition is a lock (``<name>/_partitions/<p>``, :class:`PartitionLock`): its owner
is the holder, so that at most one member owns a partition whatever the members believe,
a partition is taken only once its previous owner released it or lost its session, and
its fence is the lock's (strictly increasing from owner to owner).

Work on a partition runs in ``async with owner.partition(p)`` (:class:`PartitionBlock`): a scope
that is cancelled when the partition goes (:meth:`PartitionState.end`). Taken away, the partition
is released only after every such block has ended (:meth:`coord.Owner._keep` waits for
:attr:`PartitionState.idle`), so that the next owner starts after this one stopped; lost, its
blocks are cancelled as soon as the loss is known, which the lease's local deadline
makes sure is before the store lets another member take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._core.exceptions import PartitionLost
from .._core.keys import internal_name
from .._locks.hold import Hold
from .._locks.task_lock import TaskLock

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

__all__ = ["PartitionBlock", "PartitionHold", "PartitionLock", "PartitionState", "lock_name"]


def lock_name(name: str, partition: int) -> str:
    """The name of the lock of *partition* of the partitioner *name*."""
    return internal_name(name, "_partitions", str(partition))


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


class PartitionState:
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


class PartitionBlock:
    """``async with owner.partition(p)``: a scope cancelled when the partition goes.

    :param parts: the member's partitions, by number (each one the assignment gives it,
        owned or still being acquired)
    :param changed: the event set at the next change of *parts* or of a part's state
    """

    def __init__(
        self,
        parts: Mapping[int, PartitionState],
        changed: Callable[[], anyio.Event],
        name: str,
        number: int,
    ) -> None:
        self._parts = parts
        self._changed = changed
        self._name = name
        self._number = number
        self._part: PartitionState | None = None
        self._scope: anyio.CancelScope | None = None

    async def _owned(self) -> PartitionState:
        """The part, once owned: at once if it is, after the acquire if the assignment
        gives it to this member and its previous owner has yet to let it go."""
        await anyio.lowlevel.checkpoint()
        waited: PartitionState | None = None  # the part waited for (gone, it says why)
        while True:
            part = self._parts.get(self._number)
            if part is not None and part.usable:
                return part
            if part is None and waited is not None:
                why = waited.why or "its acquire ended before it was owned"
            elif part is None:
                why = "the assignment does not give it to this member"
            elif part.why is not None:
                why = part.why
            elif part.hold is not None:
                why = "it was lost"
            else:  # assigned, being acquired: its previous owner has yet to let it go
                waited = part
                await self._changed().wait()
                continue
            raise PartitionLost(
                f"partition {self._number} of {self._name!r} is not this member's: {why}"
            )

    async def __aenter__(self) -> PartitionHold:
        part = await self._owned()
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
                f"partition {self._number} of {self._name!r} went while worked on "
                f"(fence {part.hold.fence}): {part.why or 'it was lost'}"
            )
        return swallowed
