"""Semaphore: at most *limit* holders at once, served in FIFO order, fenced, loud when lost.

Waiters queue exactly as for a mutex (:mod:`coord._locks.wait_queue`); my turn comes when fewer than
*limit* entries are ahead of mine. A waiter watches the *limit* entries right ahead of it
and nothing else: a holder that leaves wakes only the waiters whose window it was in —
one when holders leave in the order they came, at most *limit* otherwise — never the
whole queue.

Curator's ``maxLeases`` rule (watch only the entry *limit* places ahead) wakes fewer, but
wrongly: with limit 2 and holders A, B, a first waiter watching A is not woken when B
leaves, and the free slot stays empty until A leaves too.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._core.checks import check_int
from .._core.exceptions import ConfigurationError
from .._sessions.identity import waiter_value
from .task_lock import TaskLock
from .wait_queue import Rule

if TYPE_CHECKING:
    from .._sessions.session import SessionSource
    from ..abc import Position

__all__ = ["Semaphore"]

#: The most holders a semaphore may allow: each waiter watches that many keys.
MAX_LIMIT = 1000


class Semaphore(TaskLock):
    """A distributed counting semaphore: at most *limit* holders, FIFO, each with a fence.

    Example::

        async with client.semaphore("gpu", limit=4) as hold:
            await train(fence=hold.fence)

    Loss semantics are those of :class:`coord.Mutex`: a holder whose session is lost, or
    whose key is deleted, is cancelled and gets :exc:`coord.LockLost`. A task holds at
    most one slot of a semaphore: asking again raises :exc:`coord.LockedError`.

    Every client must use the same *limit*. Each waiter records its limit in its key; a
    waiter that finds an entry ahead of it recording another limit (or another kind of
    lock under the same name) raises :exc:`coord.ConfigurationError`, and its key is
    removed. Clients that disagree without meeting in a window are not detected: each
    counts the entries ahead of it by its own limit, so the largest limit in use may hold
    at once.

    :param session: where the waiter keys' lease comes from
    :param name: slash-separated name
    :param limit: how many may hold at once (1 to 1000)
    :param layout: ``"coord"`` (the default); the peers' semaphores are refused
    :raises ConfigurationError: for a bad *limit*, or a layout without a semaphore
    """

    _what = "semaphore"
    _kind = "semaphore"

    def __init__(
        self, session: SessionSource, name: str, limit: int, *, layout: str = "coord"
    ) -> None:
        if not 1 <= check_int(limit, "limit") <= MAX_LIMIT:
            raise ConfigurationError(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
        super().__init__(session, name, layout=layout)
        self._limit = limit
        self._rule = Rule(ahead=limit, limit=limit)

    @property
    def limit(self) -> int:
        return self._limit

    def __repr__(self) -> str:
        return f"<coord.Semaphore {self._name!r} limit={self._limit} held here={len(self._held())}>"

    def _value(self) -> bytes:
        return waiter_value(self._source.identity, limit=self._limit)

    def _check(self, position: Position) -> None:
        for entry in position.ahead:
            try:
                limit = json.loads(entry.value).get("limit")
            except (ValueError, AttributeError):
                limit = None
            if limit != self._limit:
                found = f"limit={limit}" if limit is not None else "a waiter of another kind"
                raise ConfigurationError(
                    f"semaphore {self._name!r}: this client uses limit={self._limit}, but "
                    f"{entry.key} ahead of it records {found}: every client must agree"
                )
