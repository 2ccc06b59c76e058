"""Partitioner: P partitions shared out among the live members of a group, each owned by
one member at a time, with a fence per partition.

Layout under the partitioner's name ``n``:

* ``n/@…``: the members (a :class:`coord.Group` called ``n``), in join order;
* ``n/_assignment/@…``: the assignment record
  (:class:`coord._membership.assignment.Record`), written by the coordinator, bound to
  its lease;
* ``n/_partitions/<p>/@…``: the lock of partition ``p`` (:mod:`coord._membership.owner`): its holder
  owns it.

One member, the first in join order, computes the assignment and stores it (the
*coordinator*); every member follows the stored record and queues for its partitions'
locks. Ownership is the partition's lock, so a stale record can only delay a move, never
make two owners. Why a coordinator, and why safety does not rest on it:
``docs/design/partitioner.md``.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, NoReturn

import anyio

from .._core import keys as _keys
from .._core import own_cancel
from .._core.checks import check_supervisor
from .._core.exceptions import ConfigurationError, MembershipLost, PartitionLost
from .assignment import check_partitions, partition_of
from .group import Group, Joining, Member
from .member import Owning, newest_record, records_of
from .partition import PartitionHold, lock_name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._sessions.session import SessionSource
    from .owner import Owner

__all__ = ["Partitioner"]

_log = logging.getLogger("coord")


class Partitioner:
    """*partitions* partitions shared out among the members that joined: each owned by
    one member at a time, balanced, sticky, fenced.

    Example::

        partitioner = client.partitioner("orders", partitions=64)
        async with partitioner.join() as owner:
            async for assignment in owner.assignments():
                ...  # start work on assignment.owned, in async with owner.partition(p)

    or, with a task per owned partition, rejoining after a loss::

        async def work(hold: coord.PartitionHold) -> None:
            ...  # jobs of hold.partition, writes fenced with hold.fence

        await partitioner.run(work)

    * **At most one owner per partition.** A partition is a lock: a member owns it once
      its previous owner released it or lost its session, and the partition's fence
      strictly increases from owner to owner.
    * **Told first.** Work on a partition runs in ``async with owner.partition(p)``: when
      the partition is taken away, that block is cancelled and has ended before the
      partition is released; when it is lost with the session, it is cancelled as soon as
      the loss is known, before the store can let another member take it. Either way the
      block raises :exc:`coord.PartitionLost`.
    * **Balanced and sticky.** With M members each owns ⌊P/M⌋ or ⌈P/M⌉ partitions; a join
      or a leave moves only the partitions that the balance needs; a dead member's
      partitions are owned again once its session expires (its TTL, plus a round trip).
    * **No herd, no polling.** The first member to join computes the assignment and
      stores it; every member follows that record on the store's watch (see the module's
      docstring for why a coordinator and why safety does not depend on it).

    :param session: where the members' lease comes from
    :param name: slash-separated name; the members are the :class:`coord.Group` of that
        name (:attr:`group`)
    :param partitions: how many partitions (1 to 10,000); every member must use the same
    """

    def __init__(self, session: SessionSource, name: str, partitions: int) -> None:
        self._source = session
        self._name = _keys.check_name(name)
        self._partitions = check_partitions(partitions)
        longest = lock_name(name, self._partitions - 1)
        if len(longest) > _keys.MAX_NAME_LENGTH:
            raise ConfigurationError(
                f"the partitioner's name is too long: the names it uses under it (such as "
                f"'.../{longest.rpartition('/')[0].rpartition('/')[2]}/"
                f"{self._partitions - 1}') take {len(longest)} characters; the limit is "
                f"{_keys.MAX_NAME_LENGTH}"
            )
        self._group = Group(session, name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def group(self) -> Group:
        """The members: the :class:`coord.Group` of this name."""
        return self._group

    def __repr__(self) -> str:
        return f"<coord.Partitioner {self._name!r} partitions={self._partitions}>"

    def partition_of(self, key: str | bytes) -> int:
        """The partition of *key*, the same in every process and language: the first 8
        bytes of the SHA-256 of the key (UTF-8 for a str), as a big-endian unsigned
        integer, modulo :attr:`partitions`. Not a checkpoint.

        :raises TypeError: if *key* is neither str nor bytes
        """
        return partition_of(key, self._partitions)

    def join(self, value: bytes = b"") -> Owning:
        """Join and own a share: ``async with partitioner.join() as owner:``.

        Entering joins the group with *value* (a checkpoint; one registration) and
        returns the :class:`coord.Owner`, which owns partitions as the assignment gives
        them (follow them with :meth:`coord.Owner.assignments`). The body runs only while
        the membership lasts: on its loss it is cancelled and the block raises
        :exc:`coord.MembershipLost`. Leaving leaves the group (its partitions are given
        out again), ends the work on every owned partition, and releases each once its
        work has ended (its next owner waits for that). A cancelled or failed join leaves
        nothing.

        :raises TypeError: if *value* is not bytes (at the call)
        :raises ConfigurationError: for a *value* larger than the store takes (at the
            call); from the block, if the stored assignment has another partition count
        """
        joining = Joining(self._source, self._name, self._group._check_value(value))
        return Owning(self._source, self._name, self._partitions, joining)

    async def members(self) -> list[Member]:
        """The live members, in join order (:meth:`coord.Group.members`). A checkpoint."""
        return await self._group.members()

    async def assignment(self) -> dict[int, str]:
        """The stored assignment: each partition's member id (:attr:`coord.Member.id`),
        as the coordinator last wrote it; empty when there is none. What members are
        given, not what they hold yet. A checkpoint; one read.

        :raises BackendUnavailable: if the store cannot be reached
        """
        listing = await self._source.read(lambda b: b.entries(records_of(self._name)))
        record = newest_record(listing)
        prefix = _keys.prefix_of(self._name)
        return {p: prefix + owner for p, owner in record.owners.items()} if record else {}

    async def run(
        self,
        work: Callable[[PartitionHold], Awaitable[object]],
        value: bytes = b"",
        *,
        cooldown: float = 1.0,
    ) -> NoReturn:
        """Join, run ``work(hold)`` in a task per owned partition, and join again after a
        loss, until cancelled.

        Each task runs in ``async with owner.partition(p)``: cancelled when the partition
        is taken away or lost (that is logged, not raised). A *work* that returns leaves
        its partition owned but idle. After the membership is lost, waits *cooldown*
        seconds and joins again. An exception from *work* ends the membership and
        propagates; so does a native cancellation of its own task (asyncio's
        ``task.cancel()``), as a RuntimeError that says so.

        :raises TypeError: if *work* is not callable, *value* not bytes or *cooldown* not
            a number (at the call)
        :raises ConfigurationError: for a *cooldown* below 0 or not finite, or a *value*
            larger than the store takes (at the call)
        """
        cooldown = check_supervisor(work, cooldown)
        value = self._group._check_value(value)
        while True:
            try:
                async with self.join(value) as owner:
                    await _serve(owner, work)
            except MembershipLost as exc:
                _log.info("%s: joining again after the loss: %s", self._name, exc)
            await anyio.sleep(cooldown)


def _cancelled(partition: int) -> RuntimeError:
    return RuntimeError(
        f"the work on partition {partition} was cancelled, and not by coord or the caller "
        "(asyncio: its task cancelled itself, or it awaited a task that was cancelled)"
    )


async def _serve(owner: Owner, work: Callable[[PartitionHold], Awaitable[object]]) -> None:
    """Run *work* in a task per partition as *owner* owns them."""

    async def one(partition: int, fence: int) -> None:
        try:
            async with owner.partition(partition) as hold:
                # (Its native cancellation of its own is its exception; a scope's, coord's
                # or the caller's, is itself: see coord._core.own_cancel.)
                await own_cancel.as_failure(partial(work, hold), partial(_cancelled, partition))
                await anyio.sleep_forever()  # owned, idle: not started again
        except PartitionLost as exc:
            _log.info("%s", exc)
        except Exception as exc:  # raised as itself, not in an exception group
            failed.append(exc)
            tg.cancel_scope.cancel()
        finally:
            if running.get(partition) == fence:
                del running[partition]

    running: dict[int, int] = {}  # partition: the fence its task was started for
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:
        async for assignment in owner.assignments():
            for partition, fence in sorted(assignment.fences.items()):
                if running.get(partition) != fence:
                    running[partition] = fence
                    tg.start_soon(one, partition, fence)
    if failed:
        raise failed[0]
