"""Semaphore: at most *limit* holders at once, served in FIFO order, fenced, loud when lost.

Waiters queue exactly as for a mutex (:mod:`coord._locks.wait_queue`); my turn comes when fewer than
*limit* entries are ahead of mine. A waiter watches the *limit* entries right ahead of it
and nothing else: a holder that leaves wakes only the waiters whose window it was in —
one when holders leave in the order they came, at most *limit* otherwise — never the
whole queue.

Curator's ``maxLeases`` rule (watch only the entry *limit* places ahead) wakes fewer, but
wrongly: with limit 2 and holders A, B, a first waiter watching A is not woken when B
leaves, and the free slot stays empty until A leaves too.

With ``layout="curator"`` the semaphore is instead Curator's ``InterProcessSemaphoreV2``
(:mod:`coord._locks.curator_semaphore`), which counts its leases behind a mutex.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING

from .._core.checks import check_int
from .._core.exceptions import ConfigurationError
from .._sessions.identity import waiter_value
from .curator_semaphore import lease_turn, lease_waiters
from .node_layouts import CURATOR_LEASE
from .task_lock import TaskLock
from .wait_queue import Rule

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._sessions.identity import Waiter
    from .._sessions.session import SessionSource
    from ..abc import Position
    from .hold import Hold
    from .node_layouts import Side

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

    **The Curator layout** (``layout="curator"``, on ZooKeeper only): the nodes and
    protocol of Apache Curator's ``InterProcessSemaphoreV2(client, NAME, limit)``
    (``curator-recipes/.../locks/InterProcessSemaphoreV2.java``), so that Java services
    and coord's clients share the same *limit* leases. A contender takes Curator's mutex
    at ``NAME/locks``, creates its lease ``NAME/leases/_c_<uuid>-lease-<seq>``, holds
    once the children of ``NAME/leases`` number at most *limit*, waiting on a watch of
    them until then, and releases the mutex. The order is the mutex's FIFO; the fence is
    the lease node's czxid; the node holds this client's identity and limit (Curator's
    hold the peer's IP address). A loss cancels the body and raises
    :exc:`coord.LockLost`; a cancelled acquire leaves no node; a waiter whose session is
    lost starts over on the next. Curator checks no limit (its ``maxLeases`` is a
    convention), and neither does this layout: clients that disagree hold as many as the
    largest limit allows each time it counts.

    :param session: where the waiter keys' lease comes from
    :param name: slash-separated name
    :param limit: how many may hold at once (1 to 1000)
    :param layout: ``"coord"`` (the default) or ``"curator"``; kazoo's and etcd's are
        refused
    :raises ConfigurationError: for a bad *limit*, or a layout without a semaphore (or
        one the store does not speak)
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

    def _peer_side(self, layout: str) -> Side:
        return CURATOR_LEASE if layout == "curator" else super()._peer_side(layout)

    def _turn(self, *, wait: bool) -> Awaitable[Hold]:
        if self._layout != "curator":
            return super()._turn(wait=wait)
        return lease_turn(
            self._source,
            self._name,
            self._prefix,
            self._limit,
            value=self._value,
            hold_type=self._node_hold_type,
            wait=wait,
        )

    async def waiters(self) -> list[Waiter]:
        """Everyone in the queue, in order: who holds, then who waits (see
        :meth:`coord.Mutex.waiters`). In the Curator layout: the leases, then those
        queued on its ``locks`` mutex. A checkpoint; a few reads of the store.

        :raises BackendUnavailable: if the store cannot be reached
        """
        if self._layout != "curator":
            return await super().waiters()
        read = partial(lease_waiters, prefix=self._prefix, limit=self._limit)
        return await self._source.read(read)

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
