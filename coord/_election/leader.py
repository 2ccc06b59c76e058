"""Who leads an election: :class:`Leader`, and the iterator behind
:meth:`coord.Election.observe`.

``observe`` reads the head of the queue, then waits for exactly that key to change or go
(or, with no leader, for any key to appear), and reads again: level-triggered, so it
reports "no leader" (google/trillian#1387), never the wrong one on batched writes (etcd
#18163), and an error or a lost history only makes it read again (it never closes on
its own). It needs no session: only reads and watches; each wait runs in the session
source's :meth:`~coord._sessions.session.SessionSource.reading` scope, so it ends when the client
closes (ClosedError) and, with ``renew=False``, as soon as its session is lost
(SessionExpiredError: on every store alike; ZooKeeper refuses every request once its
session is over, where etcd could follow on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core import retry as _retry
from .._core.exceptions import BackendError, ClosedError, SessionExpiredError
from .._core.keys import fence_of
from .._locks.node_turn import node_contenders
from .._sessions.identity import parse_identity, since_of, waiter_value, waiter_value_size
from ..abc import Listing

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._locks.node_layouts import Side
    from .._sessions.session import SessionSource
    from ..abc import Backend, Entry

__all__ = [
    "CANDIDATE",
    "EtcdLeaders",
    "Leader",
    "Leaders",
    "NodeLeaders",
    "candidate_record",
    "candidate_room",
    "candidate_value",
    "node_head",
    "proclaim_room",
    "proclaimed",
]

#: The role recorded in a candidate's entry, beside who registered it and when (so that
#: tools tell an election's entries from a lock's, which share its layout).
CANDIDATE = "candidate"

# A candidate's entry: a line of JSON (who campaigns, when, its role), then the value as
# given: raw, so that a leader's value may take nearly all the store allows.
_SEPARATOR = b"\n"


def candidate_record(who: dict[str, Any], value: bytes) -> bytes:
    """What a candidate's entry holds: who campaigns (host, pid, name), when, and *value*."""
    return waiter_value(who, role=CANDIDATE) + _SEPARATOR + value


def candidate_room(who: dict[str, Any], max_value_size: int) -> int:
    """The largest value a candidate's entry fits in *max_value_size* bytes, whenever it
    is written (the registration time at its widest)."""
    return max(max_value_size - waiter_value_size(who, role=CANDIDATE) - len(_SEPARATOR), 0)


def _split(raw: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The header and the value of a candidate's entry; None for an entry written by
    something else."""
    header, found, value = raw.partition(_SEPARATOR)
    if not found or not header.startswith(b"{"):
        return None
    record = parse_identity(header)
    return (record, value) if record.get("role") == CANDIDATE else None


def candidate_value(raw: bytes) -> bytes:
    """The value a candidate's entry holds (as campaigned or proclaimed); the whole of
    *raw* for an entry written by something else."""
    split = _split(raw)
    return raw if split is None else split[1]


def proclaimed(raw: bytes, value: bytes) -> bytes:
    """The entry *raw* of a candidate with *value* in place of its value (the same
    header: who campaigned, and when)."""
    return raw[: raw.index(_SEPARATOR) + 1] + value if _split(raw) is not None else value


def proclaim_room(raw: bytes, max_value_size: int) -> int:
    """The largest value that :func:`proclaimed` fits in *max_value_size* bytes."""
    return max_value_size - len(proclaimed(raw, b""))


@dataclass(frozen=True)
class Leader:
    """Who leads an election, as read from the store.

    :ivar key: the leader's candidate key
    :ivar value: the value it campaigned with (or proclaimed since)
    :ivar fence: its term's fencing token
    :ivar identity: who campaigned: ``host``, ``pid``, and ``name`` when the client was
        given one (``connect(..., identity=...)``); empty for an entry written by
        something else
    :ivar since: when it campaigned (Unix seconds, its machine's clock), or None
    """

    key: str
    value: bytes
    fence: int
    identity: dict[str, Any] = field(default_factory=dict, compare=False)
    since: float | None = field(default=None, compare=False)

    @classmethod
    def _of(cls, entry: Entry, *, raw: bool = False) -> Leader:
        if raw:  # the etcd layout: the value as written, the create revision as fence
            return cls(entry.key, entry.value, entry.revision)
        fence = fence_of(entry.revision)
        split = _split(entry.value)
        if split is None:
            return cls(entry.key, entry.value, fence)
        record, value = split
        since = since_of(record.pop("since", None))
        who = {k: v for k, v in record.items() if k != "role"}
        return cls(entry.key, value, fence, who, since)


class Leaders:
    """The iterator behind :meth:`coord.Election.observe` (not a generator: leaving the loop
    early leaves nothing to finalize)."""

    def __init__(self, source: SessionSource, prefix: str) -> None:
        self._source = source
        self._prefix = prefix
        self._seen: tuple[Entry | None, int] | None = None  # what was read, at which revision
        self._last: Leader | None = None
        self._yielded = False

    def __aiter__(self) -> Leaders:
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
                listing = await self._head(backend)
            except (BackendError, SessionExpiredError):
                await _retry.backoff(attempt)
                attempt += 1
                self._seen = None
                continue
            attempt = 0
            head = listing.entries[0] if listing.entries else None
            self._seen = (head, listing.revision)
            leader = self._leader(head) if head is not None else None
            if not self._yielded or leader != self._last:
                self._last, self._yielded = leader, True
                return leader

    def _head(self, backend: Backend) -> Awaitable[Listing]:
        return backend.entries(self._prefix, limit=1)

    def _leader(self, head: Entry) -> Leader:
        return Leader._of(head)

    async def _wait(self, head: Entry | None, revision: int) -> None:
        """Until the leader read at *revision* may have changed."""
        backend = self._source.backend
        if head is not None:
            await backend.wait_changed(head, revision=revision)
            return
        async with backend.watch(self._prefix, revision=revision) as changes:
            async for _ in changes:
                return


class EtcdLeaders(Leaders):
    """``observe`` in the etcd layout: the first key under the prefix by creation, as
    election.go's ``observe`` reads it; with none, any key made under the prefix ends
    the wait (its watch ``WithPrefix``), then it reads again."""

    def _head(self, backend: Backend) -> Awaitable[Listing]:
        return backend.keys_by_creation(self._prefix, limit=1)

    def _leader(self, head: Entry) -> Leader:
        return Leader._of(head, raw=True)

    async def _wait(self, head: Entry | None, revision: int) -> None:
        backend = self._source.backend
        if head is not None:
            await backend.wait_changed(head, revision=revision)
        else:
            await backend.wait_keys_changed(self._prefix, revision=revision)


async def node_head(backend: Backend, *, prefix: str, side: Side) -> Listing:
    """The first contender of *side*'s queue (kazoo's ``contenders()[0]``, Curator's
    ``LeaderLatch.getLeader()``: the first whose node could be read), at the revision of
    the listing."""
    found, revision = await node_contenders(backend, prefix, side, limit=1)
    return Listing(tuple(entry for entry, _ in found), revision)


class NodeLeaders(EtcdLeaders):
    """``observe`` in kazoo's or Curator's layout: the first contender by the peer's
    order; with none, a change of the children ends the wait (a children watch: what
    ``wait_keys_changed`` is on ZooKeeper)."""

    def __init__(self, source: SessionSource, prefix: str, side: Side) -> None:
        super().__init__(source, prefix)
        self._side = side

    def _head(self, backend: Backend) -> Awaitable[Listing]:
        return node_head(backend, prefix=self._prefix, side=self._side)
