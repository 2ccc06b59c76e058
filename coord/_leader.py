"""Who leads an election: :class:`Leader`, and the iterator behind
:meth:`coord.Election.observe`.

``observe`` reads the head of the queue, then waits for exactly that key to change or go
(or, with no leader, for any key to appear), and reads again: level-triggered, so it
reports "no leader" (google/trillian#1387), never the wrong one on batched writes (etcd
#18163), and an error or a lost history only makes it read again (it never closes on
its own). It needs no session: only reads and watches; each wait runs in the session
source's :meth:`~coord._session.SessionSource.reading` scope, so it ends when the client
closes (ClosedError) and, with ``renew=False``, as soon as its session is lost
(SessionExpiredError: on every store alike; ZooKeeper refuses every request once its
session is over, where etcd could follow on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _retry
from ._exceptions import BackendError, ClosedError, SessionExpiredError
from ._keys import fence_of

if TYPE_CHECKING:
    from ._session import SessionSource
    from .abc import Entry

__all__ = ["Leader", "Observer"]


@dataclass(frozen=True)
class Leader:
    """Who leads an election, as read from the store.

    :ivar key: the leader's candidate key
    :ivar value: the value it campaigned with (or proclaimed since)
    :ivar fence: its term's fencing token
    """

    key: str
    value: bytes
    fence: int

    @classmethod
    def _of(cls, entry: Entry) -> Leader:
        return cls(entry.key, entry.value, fence_of(entry.revision))


class Observer:
    """The iterator behind :meth:`coord.Election.observe` (not a generator: leaving the loop
    early leaves nothing to finalize)."""

    def __init__(self, source: SessionSource, prefix: str) -> None:
        self._source = source
        self._prefix = prefix
        self._seen: tuple[Entry | None, int] | None = None  # what was read, at which revision
        self._last: Leader | None = None
        self._yielded = False

    def __aiter__(self) -> Observer:
        return self

    async def __anext__(self) -> Leader | None:
        self._source.check_open()
        with self._source.reading():
            return await self._next()
        raise ClosedError("observe: the client was closed")  # pragma: no cover

    async def _next(self) -> Leader | None:
        backend = self._source.backend
        attempt = 0
        while True:
            if self._seen is not None:
                try:
                    await self._wait(*self._seen)
                except (BackendError, SessionExpiredError):
                    # (ZooKeeper refuses reads between a lost session and the next.)
                    await _retry.backoff(attempt)  # read again, then watch again
                    attempt += 1
            try:
                listing = await backend.entries(self._prefix, limit=1)
            except (BackendError, SessionExpiredError):
                await _retry.backoff(attempt)
                attempt += 1
                self._seen = None
                continue
            attempt = 0
            head = listing.entries[0] if listing.entries else None
            self._seen = (head, listing.revision)
            leader = Leader._of(head) if head is not None else None
            if not self._yielded or leader != self._last:
                self._last, self._yielded = leader, True
                return leader

    async def _wait(self, head: Entry | None, revision: int) -> None:
        """Until the leader read at *revision* may have changed."""
        backend = self._source.backend
        if head is not None:
            await backend.wait_changed(head, revision=revision)
            return
        async with backend.watch(self._prefix, revision=revision) as changes:
            async for _ in changes:
                return
