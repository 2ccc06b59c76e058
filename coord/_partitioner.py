"""Partitioner: P partitions shared out among the live members of a group, each owned by
one member at a time, with a fence per partition.

Layout under the partitioner's name ``n``:

* ``n/@…``: the members (a :class:`coord.Group` called ``n``), in join order;
* ``n/_assignment/@…``: the assignment record (:class:`coord._assign.Record`), written by
  the coordinator, bound to its lease;
* ``n/_partitions/<p>/@…``: the lock of partition ``p`` (:mod:`coord._owner`): its holder
  owns it.

**Why a coordinator.** A sticky assignment needs the previous one (a pure function of the
membership cannot be both exactly balanced and move only what a join or a leave needs),
so one member computes it from the previous record and the membership it just read, and
stores it: the *coordinator*, the member that joined first (the head of the group's
queue; the others each watch only the member ahead of them, as lock waiters do, and the
next in line takes over when it leaves or dies). It writes in one transaction that
checks its own membership still exists and replaces the record it read, so a coordinator
that was paused and expired writes nothing. Every member follows the record (one watch,
one wake per change) and queues for the locks of the partitions it gives it, letting go
of the others; a membership change wakes the coordinator once and then every member
once. Versus every member computing from the same snapshot: one write per change instead
of one per member, and no stored state that the members must agree on first.

**Why safety does not rest on it.** Ownership is the partition's lock, so two records
(a paused coordinator's and its successor's) or a member acting on an old one can only
delay a move, never make two owners: the next owner queues behind the previous one's key
and gets the lock when that key is deleted (released, or its session expired), with a
higher fence.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, NoReturn

import anyio

from . import _keys, _retry
from ._assign import Record, assign, check_partitions, partition_of
from ._checks import check_supervisor
from ._exceptions import (
    BackendError,
    ClosedError,
    ConfigurationError,
    EntryGoneError,
    MembershipLost,
    PartitionLost,
    SessionExpiredError,
)
from ._group import Group, Joining, Member
from ._owner import Owner, PartitionHold, lock_name
from .abc import Check, Create, Remove

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from ._group import Membership
    from ._session import SessionSource
    from .abc import Backend, Entry, Listing, Op

__all__ = ["Owning", "Partitioner", "newest_record", "records_of"]

_log = logging.getLogger("coord")

#: At most this many old records are replaced by one write (a transaction's limit is 64).
_REPLACED = 60


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
        :exc:`coord.MembershipLost`. Leaving ends the work on every owned partition,
        releases them, then leaves the group. A cancelled or failed join leaves nothing.

        :raises TypeError: if *value* is not bytes (at the call)
        :raises ConfigurationError: for a *value* larger than the store takes (at the
            call); from the block, if the stored assignment has another partition count
        """
        return Owning(self, Joining(self._source, self._name, self._group._check_value(value)))

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
        propagates.

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
                _log.info("coord: %s: joining again after the loss: %s", self._name, exc)
            await anyio.sleep(cooldown)


async def _serve(owner: Owner, work: Callable[[PartitionHold], Awaitable[object]]) -> None:
    """Run *work* in a task per partition as *owner* owns them."""

    async def one(partition: int, fence: int) -> None:
        try:
            async with owner.partition(partition) as hold:
                await work(hold)
                await anyio.sleep_forever()  # owned, idle: not started again
        except PartitionLost as exc:
            _log.info("coord: %s", exc)
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


def records_of(name: str) -> str:
    """The prefix of the assignment records of the partitioner *name*."""
    return _keys.prefix_of(f"{name}/_assignment")


def _records(listing: Listing) -> list[Entry]:
    """The entries of *listing* that are assignment records (the name is the
    partitioner's, but a user may have put something else there)."""
    found = []
    for entry in listing.entries:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            Record.decode(entry.value, 0)
            found.append(entry)
    return found


def newest_record(listing: Listing) -> Record | None:
    """The newest record of *listing* that reads as one (None if there is none)."""
    for entry in reversed(listing.entries):
        try:
            return Record.decode(entry.value, _keys.fence_of(entry.revision))
        except (ValueError, KeyError, TypeError):
            _log.warning("coord: %s is not an assignment record: ignored", entry.key)
    return None


class Owning:
    """One membership of a partitioner: what :meth:`Partitioner.join` returns. Use it with
    ``async with partitioner.join() as owner:``; made anew for each join."""

    def __init__(self, partitioner: Partitioner, joining: Joining) -> None:
        self._partitioner = partitioner
        self._joining = joining
        self._owner = Owner(partitioner._source, partitioner.name, partitioner.partitions)
        self._done = anyio.Event()
        self._loops = anyio.CancelScope()
        self._error: Exception | None = None
        self._written: Entry | None = None  # the record this member wrote last
        self._unsure = False  # a write of a record whose outcome is unknown

    def __repr__(self) -> str:
        return f"<coord.Owning {self._partitioner.name!r}>"

    async def __aenter__(self) -> Owner:
        membership = await self._joining.__aenter__()
        self._owner.membership = membership
        try:
            membership.session.start_soon(self._run)
        except BaseException:
            await self._joining.__aexit__(None, None, None)
            raise
        return self._owner

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        self._stop("the member left the group")
        try:
            # Leave the group first, so that the partitions are given out again while
            # their work ends here; each is released once its work has ended, so that
            # its next owner starts after this one stopped.
            swallowed = await self._joining.__aexit__(exc_type, exc_val, exc_tb)
        finally:
            # (A native cancellation of this wait leaves the releases to the session's
            # task, which carries on.)
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + 2 * self._membership.session.ttl
                await self._done.wait()
            if scope.cancelled_caught:
                name = self._partitioner.name
                _log.warning("coord: %s: left with partitions not yet released", name)
        if self._error is not None:
            raise self._error
        return swallowed

    def _stop(self, why: str) -> None:
        self._loops.cancel()
        self._owner._end(why)

    def _fail(self, error: Exception) -> None:
        """A member that cannot take part: end the membership's block with *error*."""
        self._error = error
        self._stop(str(error))
        membership = self._owner.membership
        if membership is not None and membership._scope is not None:
            membership._scope.cancel()

    async def _run(self) -> None:
        """The owner's tasks, in the session's task group: follow the assignment,
        coordinate when first in line, keep the owned partitions."""
        try:
            async with anyio.create_task_group() as tg:
                self._owner._tg = tg
                with self._loops:
                    async with anyio.create_task_group() as loops:
                        loops.start_soon(self._follow)
                        loops.start_soon(self._coordinate)
        except Exception as exc:  # never into the session's task group: to the block
            _log.exception("coord: %s: the member's tasks failed", self._partitioner.name)
            self._fail(exc)
        finally:
            session = self._membership.session
            if self._written is not None:  # leave no record behind (a successor writes its own)
                session.discard(self._written)
            if self._unsure and session.running and not session.lost:
                with contextlib.suppress(ClosedError):
                    session.start_soon(self._forget_records)
            self._done.set()

    async def _forget_records(self) -> None:
        """Delete the records bound to this member's session: a write whose outcome was
        unknown may have made one. Runs in the session's task group."""
        session = self._membership.session
        with contextlib.suppress(BackendError, SessionExpiredError):
            listing = await session.backend.entries(records_of(self._partitioner.name))
            for entry in listing.entries:
                if entry.lease == session.lease.id:
                    session.discard(entry)

    # -- every member: follow the record ----------------------------------------------------

    async def _follow(self) -> None:
        backend = self._membership.session.backend
        prefix = records_of(self._partitioner.name)
        seen: int | None = None  # the revision of the last listing read
        attempt = 0
        while True:
            if seen is not None:
                try:
                    await _next_change(backend, prefix, seen)
                except (BackendError, SessionExpiredError):
                    await _retry.backoff(attempt)  # read again, then watch again
                    attempt += 1
            try:
                listing = await backend.entries(prefix)
            except (BackendError, SessionExpiredError):
                await _retry.backoff(attempt)
                attempt += 1
                seen = None
                continue
            attempt = 0
            seen = listing.revision
            record = newest_record(listing)
            current = self._owner.record
            if record is None or (current is not None and record.generation <= current.generation):
                continue  # none (its coordinator left: no news), or no newer
            if record.partitions != self._partitioner.partitions:
                self._fail(_mismatch(self._partitioner, record))
                return
            self._owner._apply(record)

    # -- the first member: coordinate -------------------------------------------------------

    @property
    def _membership(self) -> Membership:
        membership = self._owner.membership
        assert membership is not None
        return membership

    async def _coordinate(self) -> None:
        await self._until_first()
        backend = self._membership.session.backend
        members_prefix = _keys.prefix_of(self._partitioner.name)
        revision: int | None = None
        attempt = 0
        while True:
            try:
                if revision is not None:
                    await _next_change(backend, members_prefix, revision)
                members = await backend.entries(members_prefix)
                records = await backend.entries(records_of(self._partitioner.name))
                written = await self._write(members, records)
            except (BackendError, SessionExpiredError):
                written = False  # ResyncNeeded too: read again
            if not written:
                await _retry.backoff(attempt)
                attempt += 1
                revision = None
                continue
            attempt = 0
            revision = members.revision

    async def _write(self, members: Listing, records: Listing) -> bool:
        """Store the assignment for *members* if it differs from the stored one. False if
        the write's guards failed (my membership, or the records, changed)."""
        ids = [_keys.new_waiter_id_of(entry.key) for entry in members.entries]
        stored = newest_record(records)
        previous = stored or self._owner.record  # none stored: its coordinator died
        if previous is not None and previous.partitions != self._partitioner.partitions:
            self._fail(_mismatch(self._partitioner, previous))
            await anyio.sleep_forever()
        owners = assign(previous.owners if previous else {}, ids, self._partitioner.partitions)
        if stored is not None and stored.owners == owners and len(_records(records)) == 1:
            return True
        record = Record(self._partitioner.partitions, tuple(ids), owners)
        membership = self._membership
        ops: list[Op] = [
            Check(membership.entry),
            *(Remove(entry) for entry in _records(records)[-_REPLACED:]),
            Create(
                records_of(self._partitioner.name),
                _keys.new_waiter_id(),
                record.encode(),
                membership.session.lease,
            ),
        ]
        # Not cancelled half-way at the leave: the record it wrote is known, and deleted.
        with anyio.CancelScope(shield=True):
            try:
                result = await membership.session.backend.transact(ops)
            except BackendError:
                self._unsure = True  # it may have been written: looked for at the leave
                raise
        if result is None:
            return False
        self._written = result[-1]
        _log.info(
            "coord: %s: assignment for %d members written (%d partitions)",
            self._partitioner.name,
            len(ids),
            self._partitioner.partitions,
        )
        return True

    async def _until_first(self) -> None:
        """Return once this member is the first in the group (watching only the member
        ahead, as a lock waiter does)."""
        membership = self._membership
        backend = membership.session.backend
        attempt = 0
        while True:
            try:
                position = await backend.position(membership.entry, ahead=1)
                if position.is_head:
                    return
                await backend.wait_deleted([position.ahead[0].key], revision=position.revision)
                attempt = 0
            except EntryGoneError:
                membership._key_gone()  # the membership's block is cancelled
                await anyio.sleep_forever()
            except (BackendError, SessionExpiredError):
                await _retry.backoff(attempt)
                attempt += 1


async def _next_change(backend: Backend, prefix: str, revision: int) -> None:
    """Until an entry of *prefix* is created or deleted after *revision* (records are
    replaced, never updated; and anything else a user put there changes nothing)."""
    async with backend.watch(prefix, revision=revision) as changes:
        async for _ in changes:
            return


def _mismatch(partitioner: Partitioner, record: Record) -> ConfigurationError:
    return ConfigurationError(
        f"partitioner {partitioner.name!r} has {record.partitions} partitions in the store, "
        f"not {partitioner.partitions}: every member must use the same count"
    )
