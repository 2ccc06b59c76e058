"""Group membership: join, members, watch, run.

A member registers exactly like a mutex waiter or an election candidate
(:mod:`coord._locks.wait_queue`): one entry under the group's name, bound to its session,
holding who it is and the value it joined with. Nobody waits: a member's rule reads no entry ahead
(``Rule(ahead=0)``), so joining is one registration, and the membership is held like a
lock from then on: the body of ``async with group.join(...)`` is cancelled and
:exc:`coord.MembershipLost` raised when the session is lost, the entry is deleted by
someone else, or the lease's deadline passes; leaving the block deletes the entry (in a
task of the session, retried). Members are listed in join order, which is registration
order on every store, with the fence of each membership (strictly increasing from join
to join, as a lock's).

What tooz gives Python users (``join_group``, ``get_members``, ``watch_join_group``)
polls: its watchers run when ``run_watchers()`` is called. Here :meth:`Group.watch` is
level-triggered on the store's watch, as :meth:`coord.Election.observe`: the current
members first, then every change, each list read from the store (never a partial list
after an outage, a lost watch history or a new session).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import anyio

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.checks import check_size, check_supervisor
from .._core.exceptions import BackendError, ClosedError, MembershipLost, SessionExpiredError
from .._core.keys import fence_of
from .._locks.hold import Hold
from .._locks.task_lock import TaskLock
from .._locks.wait_queue import Rule
from .._sessions.identity import unwrap, wrap, wrapped_room

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from .._sessions.session import SessionSource
    from ..abc import Entry

__all__ = ["Group", "Joining", "Member", "Membership"]

_log = logging.getLogger("coord")

#: A member reads no entry ahead and waits for none: joining is one registration.
JOINED = Rule(ahead=0)


@dataclass(frozen=True)
class Member:
    """One member of a group, as read from the store.

    :ivar id: the member's id: its group's name and the waiter id it joined with,
        unique per join, the same on every store and for the life of the membership
        (``membership.id``)
    :ivar identity: who joined: ``host``, ``pid``, and ``name`` when the client was given
        one (``connect(..., identity=...)``); empty for an entry written by something else
    :ivar value: the value it joined with
    :ivar since: when it joined (Unix seconds, the joining machine's clock), or None
    :ivar fence: its membership's fencing token: strictly increasing from join to join
    """

    id: str
    identity: dict[str, Any]
    value: bytes
    since: float | None
    fence: int

    @classmethod
    def _of(cls, entry: Entry) -> Member:
        record = unwrap(entry.value)
        value = record.value or b""
        return cls(
            member_id(entry.key), record.identity, value, record.since, fence_of(entry.revision)
        )


def member_id(key: str) -> str:
    """The id of the member whose entry key is *key*: the group's name and the waiter id
    it joined with (a store's additions around it, and the renaming of a long group's
    entries, left out: see :func:`coord._core.keys.new_waiter_id_of`)."""
    return key[: key.rindex("/") + 1] + _keys.new_waiter_id_of(key)


class Membership(Hold):
    """This client's membership of a group: returned by ``async with group.join(...)``.

    :ivar fence: strictly increasing from join to join
    """

    _lost_error = MembershipLost
    # A membership excludes nobody: an interruption the session survives (ZooKeeper
    # SUSPENDED) leaves it, and its id, as they were. Voiding it would make the member
    # join again under a new id, and the partitioner's assignment, which keys on member
    # ids, would move partitions of members that saw nothing. What excludes (a
    # partition's lock) is still voided.
    _voided_by_interruption = False

    def __repr__(self) -> str:
        state = "lost" if self.lost else "left" if self.released else "member"
        return f"<coord.Membership {self.name!r} fence={self.fence} {state}>"

    @property
    def id(self) -> str:
        """This member's id, as :attr:`Member.id` (its key may change: a ZooKeeper node
        of a long group moves into a shard)."""
        return member_id(self.key)

    @property
    def member(self) -> Member:
        """This membership as :meth:`Group.members` lists it."""
        return Member._of(self.entry)


class Joining(TaskLock):
    """One membership of a group: what :meth:`Group.join` returns. Use it with ``async
    with group.join(value) as membership:``; made anew for each join."""

    _what = "group"
    _rule = JOINED
    _hold_type = Membership
    _counted = False  # not a lock: a client's acquire statistics do not count it

    def __init__(self, source: SessionSource, name: str, value: bytes) -> None:
        super().__init__(source, name)
        self._member_value = value

    def __repr__(self) -> str:
        return f"<coord.Joining {self._name!r} value={self._member_value!r}>"

    def _value(self) -> bytes:
        return wrap(self._source.identity, self._member_value)

    async def __aenter__(self) -> Membership:
        membership = await super().__aenter__()
        assert isinstance(membership, Membership)
        return membership


class Group:
    """The members of a group: the clients that joined under one name and are still live.

    Example::

        group = client.group("workers")
        async with group.join(b"10.0.0.7:8080") as membership:
            async for members in group.watch():    # now, then every change
                rebalance(members)                  # cancelled if the membership is lost

    :param session: where the members' lease comes from
    :param name: slash-separated name (not shared with a lock or an election: entries of
        one name are one queue)
    """

    def __init__(self, session: SessionSource, name: str) -> None:
        self._source = session
        self._name = _keys.check_name(name)
        self._prefix = _keys.prefix_of(name)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<coord.Group {self._name!r}>"

    def join(self, value: bytes = b"") -> Joining:
        """Join with *value*: ``async with group.join(value) as membership:``.

        Entering registers this client (who it is, *value*, when) bound to its session:
        one request, no wait (a checkpoint). The body runs only while the membership
        lasts: on a session loss, the entry's deletion by someone else or the lease
        deadline passing, it is cancelled and the block raises
        :exc:`coord.MembershipLost`. Leaving deletes the entry (guarded by its fence, in a
        task of the session, retried). A cancelled or failed join leaves no entry. A task
        joins a group once at a time (asking again raises :exc:`coord.LockedError`).

        :raises TypeError: if *value* is not bytes (at the call)
        :raises ConfigurationError: if *value* is larger than the store takes, with room
            for who joined (at the call)
        """
        return Joining(self._source, self._name, self._check_value(value))

    @property
    def max_value_size(self) -> int:
        """The largest value :meth:`join` takes on this store, in bytes: the store's
        value limit less the member's record around it (who joins, and when), the value
        in base64 (4 bytes for 3)."""
        return wrapped_room(self._source.identity, self._source.backend.max_value_size)

    def _check_value(self, value: object) -> bytes:
        return check_size(value, self.max_value_size, "a member's value")

    async def members(self) -> list[Member]:
        """The live members, in join order. A checkpoint; one read of the store.

        :raises BackendUnavailable: if the store cannot be reached
        """
        listing = await self._source.read(lambda b: b.entries(self._prefix))
        return [Member._of(entry) for entry in listing.entries]

    def watch(self) -> AsyncIterator[list[Member]]:
        """Follow the membership: ``async for members in group.watch():``.

        Yields the current members first (in join order; empty when nobody is a member),
        then the members after every change: a join, a leave, a lost session.
        Level-triggered and de-duplicated: each list yielded was read whole from the
        store, never one already yielded; changes that come together may be yielded as
        one. Survives store outages, restarts, lost watch history and new sessions (it
        reads again and carries on), and never ends on its own otherwise. Needs no
        membership, nor a session of its own. Each step is a checkpoint.

        :raises ClosedError: when the client closes, also while waiting for a change
        :raises SessionExpiredError: with ``renew=False``, once the client's session is
            lost (as :meth:`coord.Election.observe`)
        """
        return _Watcher(self._source, self._prefix)

    async def run(
        self,
        fn: Callable[[Membership], Awaitable[object]],
        value: bytes = b"",
        *,
        cooldown: float = 1.0,
    ) -> NoReturn:
        """Join, run ``fn(membership)`` while a member, and join again, until cancelled.

        After a loss (``fn`` is cancelled, :exc:`coord.MembershipLost` is logged) or after
        ``fn`` returns (leaving), wait *cooldown* seconds before joining again (0: at
        once). Logs one "joined" line when a membership starts and one "left" line when it
        ends. An exception from *fn* leaves the group and propagates.

        :raises TypeError: if *fn* is not callable, *value* not bytes or *cooldown* not a
            number (at the call)
        :raises ConfigurationError: for a *cooldown* below 0 or not finite, or a *value*
            larger than the store takes (at the call)
        """
        value = self._check_value(value)
        cooldown = check_supervisor(fn, cooldown)
        while True:
            try:
                async with self.join(value) as membership:
                    _log.info("%s: joined (fence %d)", self._name, membership.fence)
                    try:
                        await fn(membership)
                    finally:
                        _log.info("%s: left (fence %d)", self._name, membership.fence)
            except MembershipLost:
                _log.info("%s: joining again after the loss", self._name)
            await anyio.sleep(cooldown)


class _Watcher:
    """The iterator behind :meth:`Group.watch` (not a generator: leaving the loop early
    leaves nothing to finalize)."""

    def __init__(self, source: SessionSource, prefix: str) -> None:
        self._source = source
        self._prefix = prefix
        self._revision: int | None = None  # of the last listing read
        self._last: list[Member] | None = None

    def __aiter__(self) -> _Watcher:
        return self

    async def __anext__(self) -> list[Member]:
        self._source.check_open()
        with self._source.reading():
            return await self._next()
        raise ClosedError("watch: the client was closed")  # pragma: no cover

    async def _next(self) -> list[Member]:
        backend = self._source.backend
        attempt = 0
        while True:
            if self._revision is not None:
                try:
                    async with backend.watch(self._prefix, revision=self._revision) as changes:
                        async for _ in changes:
                            break
                except (BackendError, SessionExpiredError):
                    # ResyncNeeded included: read again, then watch again. (ZooKeeper
                    # refuses reads between a lost session and the next.)
                    await _retry.backoff(attempt)
                    attempt += 1
            try:
                listing = await backend.entries(self._prefix)
            except (BackendError, SessionExpiredError):
                await _retry.backoff(attempt)
                attempt += 1
                self._revision = None
                continue
            attempt = 0
            self._revision = listing.revision
            members = [Member._of(entry) for entry in listing.entries]
            if members != self._last:
                self._last = members
                return members
