"""Waiting for one's turn in a queue of waiter entries: the algorithm every recipe shares.

The algorithm of etcd's ``concurrency.Mutex`` and Curator's lock internals, written against
:class:`coord.abc.Backend` only, with the recipe's :class:`Rule` deciding whose turn it is:

1. *register*: one request creates my waiter entry (bound to the session's lease, a fresh
   id per attempt) and reads the nearest entries ahead of it (as many as the rule needs);
2. *wait*: while the rule names entries I must outlive, wait for the deletion of one of
   those (never of the whole queue: a release wakes only the waiters it concerns), then
   re-read my position, which also checks that my entry still exists (etcd #11456),
   unless the backend proves from that deletion that I am first now;
3. *grant*: my entry's creation revision is the fencing token; the :class:`~coord.Hold`
   watches my entry and the session from registration on, so that a loss cancels the
   wait, or later the holder's body.

On a client (a :class:`~coord._sessions.keeper.SessionKeeper`) a waiter whose session is lost held
nothing: it registers again on the next session and keeps waiting. Whatever ends a wait
early (cancellation, an error, a rule's complaint) deletes the entry in a task of the
session: nothing is left behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from .._core.exceptions import BackendUnavailable, EntryGoneError, LockedError, SessionExpiredError
from .hold import Hold

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from .._sessions.session import Session, SessionSource
    from ..abc import Entry, Position

__all__ = ["EXCLUSIVE", "Rule", "await_turn", "try_turn", "wait_turn"]

H = TypeVar("H", bound=Hold)


@dataclass(frozen=True)
class Rule:
    """Whose turn it is, for one kind of waiter.

    :ivar ahead: how many of the nearest entries ahead a waiter reads (``None``: all)
    :ivar limit: how many entries may hold at once: my turn comes when fewer than
        *limit* entries are ahead of me (1: a mutex)
    :ivar kind: waiter-id prefix of the entries that count (``None``: every entry); a
        reader of a read-write lock counts only the writers ahead of it
    """

    ahead: int | None = 1
    limit: int = 1
    kind: str | None = None

    def blockers(self, position: Position) -> Sequence[str]:
        """The keys whose deletion may bring my turn; empty when it has come.

        With ``limit`` > 1 those are *all* the ``limit`` entries right ahead of mine: any
        of them leaving lets me in if no more than ``limit - 1`` others are ahead.
        Watching only the entry ``limit`` places ahead (Curator's ``maxLeases``) misses
        a holder that leaves out of order: the slot would stay empty until that one entry
        left too.
        """
        if len(position.ahead) < self.limit:
            return ()
        return [entry.key for entry in position.ahead[: self.limit]]


#: A mutex: my turn comes when nobody is ahead; wait for my predecessor only.
EXCLUSIVE = Rule()


async def wait_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    rule: Rule,
    *,
    value: bytes | Callable[[], bytes] = b"",
    waiter_id: Callable[[], str] | None = None,
    check: Callable[[Position], None] | None = None,
    hold_type: type[H] = Hold,  # type: ignore[assignment]
) -> H:
    """Register under *prefix* and wait for my turn; return the granted hold.

    A checkpoint, bounded only by the caller's cancel scope. Waits through store outages
    and session losses (registering again on the next session). If cancelled, nothing is
    held and the entry is deleted by a task of the session.

    :param value: the waiter key's value, or a function that makes it for each
        registration (a waiter that registers again on a new session records anew when)
    :param check: called with every position read; it may raise (e.g. a waiter ahead that
        disagrees on the semaphore's limit): the entry is then deleted and the error raised
    :raises SessionExpiredError: if the session is lost and no new one follows
    """
    while True:
        session = await source.live()
        record = value() if callable(value) else value  # anew for each registration
        hold = await _queue(session, name, prefix, rule, record, waiter_id, check, hold_type)
        if hold is not None:
            return hold
        if not source.renews:
            raise SessionExpiredError(
                f"my waiter key for {name!r} was deleted while waiting "
                f"({session.reason or 'deleted by another client'})"
            )


async def _queue(
    session: Session,
    name: str,
    prefix: str,
    rule: Rule,
    value: bytes,
    waiter_id: Callable[[], str] | None,
    check: Callable[[Position], None] | None,
    hold_type: type[H],
) -> H | None:
    """Register on *session* and wait for my turn; None if my key or the session went
    meanwhile (nothing is held, nothing is left behind)."""
    try:
        position = await session.register(
            prefix, value=value, ahead=rule.ahead, kind=rule.kind, waiter_id=waiter_id
        )
        # The answer may come after the session was lost and its keeper closed it: the
        # hold cannot follow a session that is over (SessionExpiredError, as for any use
        # of a lost session), and the key went with its lease.
        hold = hold_type(name, session, position)
    except (SessionExpiredError, EntryGoneError):
        return None  # the session is lost (the next one, if any), or the key went
    return await await_turn(
        session, hold, position.entry, partial(_until_turn, session, hold, position, rule, check)
    )


async def await_turn(
    session: Session, hold: H, entry: Entry, until: Callable[[], Awaitable[None]]
) -> H | None:
    """Wait for *hold*'s turn with ``await until()``, the hold cancellable as it waits
    (lost session, key gone), then grant it; None if the key or the session went
    meanwhile: then nothing is held, and *entry* is deleted (as when cancelled, which is
    re-raised)."""
    try:
        try:
            with hold._waiting():
                await until()
        finally:
            hold._scope = None
    except EntryGoneError:
        hold._key_gone()
    except SessionExpiredError:
        session.declare_lost("the store refused a request on the session's lease")
    except BaseException:
        hold._finish()
        session.discard(entry)
        raise
    if hold._gone or session.lost:
        hold._finish()
        session.discard(entry)
        return None
    hold._grant()
    return hold


async def _until_turn(
    session: Session,
    hold: Hold,
    position: Position,
    rule: Rule,
    check: Callable[[Position], None] | None,
) -> None:
    """Wait until *rule* says my turn has come (and the lease is not interrupted):
    wait for the deletion of an entry I must outlive, then read my position again (which
    also checks that my entry still exists), unless the backend proves it from that
    deletion. Each store call is awaited here directly, and the session's retry (a
    frame, a partial) made only after an outage: a waiter's memory is mostly what it
    waits with."""
    backend = session.backend
    ahead, kind = rule.ahead, rule.kind
    # An exclusive waiter's backend may prove from the deletion it saw that my entry is
    # the first now (etcd: the hand-over of its _waitqueue.py), sparing the read after it.
    mine = position.entry if rule == EXCLUSIVE else None
    while True:
        if check is not None:
            check(position)
        blockers = rule.blockers(position)
        if not blockers and not session.lease.interrupted:
            return
        hold._waited = True
        if not blockers:  # interrupted: grant nothing until it resumes
            await session.lease.wait_resumed()
        else:
            try:
                proven = await backend.wait_deleted(
                    blockers, revision=position.revision, entry=mine
                )
            except BackendUnavailable as exc:
                wait = partial(backend.wait_deleted, blockers, revision=position.revision)
                proven = await session.retry(wait, failed=exc)
            if proven is not None:
                position = proven
                continue
        try:
            position = await backend.position(position.entry, ahead=ahead, kind=kind)
        except BackendUnavailable as exc:
            read = partial(backend.position, position.entry, ahead=ahead, kind=kind)
            position = await session.retry(read, failed=exc)


async def try_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    rule: Rule,
    *,
    value: bytes | Callable[[], bytes] = b"",
    waiter_id: Callable[[], str] | None = None,
    check: Callable[[Position], None] | None = None,
    hold_type: type[H] = Hold,  # type: ignore[assignment]
) -> H:
    """Take my turn at once if it has come, else raise LockedError (the entry removed).

    A checkpoint; one round trip, or two when refused.

    :raises LockedError: if it is not my turn
    :raises BackendUnavailable: if the store cannot be reached (nothing is left)
    :raises SessionExpiredError: if the session is lost and none follows
    """
    session = await source.live()
    position = await session.register(
        prefix,
        value=value() if callable(value) else value,
        ahead=rule.ahead,
        kind=rule.kind,
        waiter_id=waiter_id,
        retry=False,
    )
    try:
        if check is not None:
            check(position)
    except BaseException:
        session.discard(position.entry)
        raise
    if rule.blockers(position) or session.lease.interrupted:
        await session.delete(position.entry)  # gone when this raises
        raise LockedError(f"{name!r} is taken")
    hold = hold_type(name, session, position)
    hold._grant()
    return hold
