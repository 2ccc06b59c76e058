"""Owning: one member's life in a partitioner, from its join to its leave.

Every member follows the assignment record (:meth:`Owning._follow`: one watch of the
records' prefix, one wake per change) and keeps the partitions it gives it
(:class:`coord.Owner`). The first member in join order also coordinates
(:meth:`Owning._coordinate`): it watches the membership and writes a new record, in one
transaction that checks its own membership and replaces the record it read. The others
each watch only the member ahead of them (:meth:`Owning._until_first`), to take over when
it goes. See :mod:`coord._membership.partitioner` for why a coordinator, and why safety does not
rest on it.

The member's tasks run in its session's task group, so that a native cancellation of
the block does not stop the releases (the session's task carries on).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import anyio

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.exceptions import (
    BackendError,
    ClosedError,
    ConfigurationError,
    EntryGoneError,
    SessionExpiredError,
)
from ..abc import Check, Create, Remove
from .assignment import Record, assign
from .owner import Owner

if TYPE_CHECKING:
    from types import TracebackType

    from .._sessions.session import SessionSource
    from ..abc import Backend, Entry, Listing, Op
    from .group import Joining, Membership

__all__ = ["Owning", "newest_record", "records_of"]

_log = logging.getLogger("coord")

#: At most this many old records are replaced by one write (a transaction's limit is 64).
_REPLACED = 60


def records_of(name: str) -> str:
    """The prefix of the assignment records of the partitioner *name*."""
    return _keys.prefix_of(_keys.internal_name(name, "_assignment"))


def _records(listing: Listing) -> list[tuple[Entry, Record]]:
    """The assignment records of *listing*, oldest first, each with its entry (the name
    is the partitioner's, but a user may have put something else there: it is left
    alone)."""
    found = []
    for entry in listing.entries:
        try:
            found.append((entry, Record.decode(entry.value, _keys.fence_of(entry.revision))))
        except (ValueError, KeyError, TypeError):
            _log.warning("%s is not an assignment record: ignored", entry.key)
    return found


def newest_record(listing: Listing) -> Record | None:
    """The newest record of *listing* (None if there is none)."""
    found = _records(listing)
    return found[-1][1] if found else None


class Owning:
    """One membership of a partitioner: what :meth:`Partitioner.join` returns. Use it with
    ``async with partitioner.join() as owner:``; made anew for each join."""

    def __init__(self, source: SessionSource, name: str, partitions: int, joining: Joining) -> None:
        self._name = name
        self._partitions = partitions
        self._joining = joining
        self._owner = Owner(source, name, partitions)
        self._done = anyio.Event()
        self._loops = anyio.CancelScope()
        self._error: Exception | None = None
        self._written: Entry | None = None  # the record this member wrote last
        self._unsure = False  # a write of a record whose outcome is unknown

    def __repr__(self) -> str:
        return f"<coord.Owning {self._name!r}>"

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
                name = self._name
                _log.warning("%s: left with partitions not yet released", name)
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
            _log.exception("%s: the member's tasks failed", self._name)
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
            listing = await session.backend.entries(records_of(self._name))
            for entry in listing.entries:
                if entry.lease == session.lease.id:
                    session.discard(entry)

    # -- every member: follow the record ----------------------------------------------------

    async def _follow(self) -> None:
        backend = self._membership.session.backend
        prefix = records_of(self._name)
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
            current = self._owner._record
            if record is None or (current is not None and record.generation <= current.generation):
                continue  # none (its coordinator left: no news), or no newer
            if record.partitions != self._partitions:
                self._fail(_mismatch(self._name, self._partitions, record))
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
        members_prefix = _keys.prefix_of(self._name)
        revision: int | None = None
        attempt = 0
        while True:
            try:
                if revision is not None:
                    await _next_change(backend, members_prefix, revision)
                members = await backend.entries(members_prefix)
                records = await backend.entries(records_of(self._name))
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
        found = _records(records)
        stored = found[-1][1] if found else None
        previous = stored or self._owner._record  # none stored: its coordinator died
        if previous is not None and previous.partitions != self._partitions:
            self._fail(_mismatch(self._name, self._partitions, previous))
            await anyio.sleep_forever()
        owners = assign(previous.owners if previous else {}, ids, self._partitions)
        if stored is not None and stored.owners == owners and len(found) == 1:
            return True
        record = Record(self._partitions, tuple(ids), owners)
        membership = self._membership
        ops: list[Op] = [
            Check(membership.entry),
            *(Remove(entry) for entry, _ in found[-_REPLACED:]),
            Create(
                records_of(self._name),
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
            "%s: assignment for %d members written (%d partitions)",
            self._name,
            len(ids),
            self._partitions,
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


def _mismatch(name: str, partitions: int, record: Record) -> ConfigurationError:
    return ConfigurationError(
        f"partitioner {name!r} has {record.partitions} partitions in the store, "
        f"not {partitions}: every member must use the same count"
    )
