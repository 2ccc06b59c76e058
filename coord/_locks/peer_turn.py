"""Waiting for one's turn in a peer's layout: the shape that every layout but coord's
shares (etcd's Go ``concurrency``, kazoo's and Curator's recipes).

The peer's own protocol makes the waiter's key (``make``) and waits until that key's turn
has come (``until``); around them, as :mod:`coord._locks.wait_queue` does for coord's
layout: the :class:`~coord._locks.hold.Hold` watches the key and the session from the
key's creation, so that a loss cancels the wait (or later the body); a key that goes
while waiting, or a lost session, means waiting again on the next session; whatever else
ends a wait early (cancellation, an error) deletes the key in a task of the session.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .._core.exceptions import BackendUnavailable, EntryGoneError, SessionExpiredError
from ..abc import Position
from .hold import Hold
from .wait_queue import await_turn

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._sessions.session import Session, SessionSource
    from ..abc import Entry

__all__ = ["queue_on", "retried", "turn_on_sessions"]

H = TypeVar("H", bound=Hold)


async def turn_on_sessions(
    source: SessionSource,
    name: str,
    hold_type: type[H],
    make: Callable[[Session], Awaitable[Entry]],
    until: Callable[[Session, Hold, Entry], Awaitable[None]],
) -> H:
    """Make my key and wait for its turn, again on the next session whenever the key or
    the session goes meanwhile; return the granted hold.

    :raises SessionExpiredError: if the session is lost and none follows
    """
    while True:
        session = await source.live()
        hold = await queue_on(session, name, hold_type, make, until)
        if hold is not None:
            return hold
        if not source.renews:
            raise SessionExpiredError(
                f"my key for {name!r} was deleted while waiting "
                f"({session.reason or 'deleted by another client'})"
            )


async def queue_on(
    session: Session,
    name: str,
    hold_type: type[H],
    make: Callable[[Session], Awaitable[Entry]],
    until: Callable[[Session, Hold, Entry], Awaitable[None]],
) -> H | None:
    """Make my key on *session* and wait for my turn; None if the key or the session
    went meanwhile (nothing held, nothing left behind)."""
    try:
        entry = await make(session)
        hold = hold_type(name, session, Position(entry, (), entry.revision))
    except (SessionExpiredError, EntryGoneError):
        return None
    return await await_turn(session, hold, entry, partial(until, session, hold, entry))


async def retried(session: Session, func: Callable[[], Awaitable[Any]]) -> Any:
    """``await func()``, through outages while the session lives (its retry, made only
    after a first failure)."""
    try:
        return await func()
    except BackendUnavailable as exc:
        return await session.retry(func, failed=exc)
