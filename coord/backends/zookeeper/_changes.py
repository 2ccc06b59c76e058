"""``Backend.watch`` on ZooKeeper: a children watch on the prefix's node, re-armed after
every event, turned into PUT / DELETE changes by comparing successive listings.

ZooKeeper keeps no history: a watch cannot start "at a revision" as on etcd. Instead
the first listing compares the node's *pzxid* (the zxid of the last change to its
children) with the revision the caller read at: if the children changed since, the
changes are reported at once — a PUT for every child created after that revision (their
czxid says so), then one DELETE whose key is the prefix itself: children may also have
been deleted since, and their names are gone, so the caller must re-read (the pzxid
cannot tell creations from deletions). Between two listings a child that came and went
unseen is not reported. Data changes of children are not watched.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import anyio
from kazoo import exceptions as kz

from ...abc import Change, ChangeKind, Entry
from ._paths import parse_waiter

if TYPE_CHECKING:
    from ._connection import Connection
    from ._paths import Paths
    from ._queue import Queues
    from ._watches import WatchRegistry

__all__ = ["ChildChanges"]


def _order(name: str) -> tuple[int, str]:
    waiter = parse_waiter(name)
    return (waiter.sequence if waiter else -1, name)


class ChildChanges:
    """The changes of one prefix, change by change (an iterator, not a generator, so
    that leaving the ``async for`` early leaves nothing to finalize)."""

    def __init__(
        self,
        conn: Connection,
        queues: Queues,
        watches: WatchRegistry,
        paths: Paths,
        prefix: str,
    ) -> None:
        self._conn = conn
        self._queues = queues
        self._watches = watches
        self._prefix = prefix
        self._node = paths.parent(prefix)
        self._known: set[str] = set()
        self._pending: deque[Change] = deque()
        self._wakeup = anyio.Event()

    def wake(self) -> None:
        self._wakeup.set()

    @property
    def node(self) -> str:
        return self._node

    async def start(self, revision: int) -> None:
        """First listing: report what changed after *revision*."""
        self._wakeup = anyio.Event()
        children, pzxid = await self._list()
        self._known = set(children)
        if pzxid is None:  # no node: if it had children at *revision*, they are gone
            if revision > 0:
                self._pending.append(Change(ChangeKind.DELETE, Entry(self._prefix), revision))
            return
        if pzxid <= revision:
            return
        entries = await self._queues.existing(self._prefix, sorted(children, key=_order))
        created = sorted((e for e in entries if e.revision > revision), key=lambda e: e.revision)
        self._pending.extend(Change(ChangeKind.PUT, e, e.revision) for e in created)
        self._pending.append(Change(ChangeKind.DELETE, Entry(self._prefix), pzxid))

    def __aiter__(self) -> ChildChanges:
        return self

    async def __anext__(self) -> Change:
        while not self._pending:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()  # events from now on call for another listing
            await self._relist()
        return self._pending.popleft()

    async def _relist(self) -> None:
        children, pzxid = await self._list()
        current = set(children)
        pzxid = pzxid or 0
        gone = sorted(self._known - current, key=_order)
        new = sorted(current - self._known, key=_order)
        self._known = current
        self._pending.extend(
            Change(ChangeKind.DELETE, Entry(self._prefix + name), pzxid) for name in gone
        )
        for entry in await self._queues.existing(self._prefix, new):
            self._pending.append(Change(ChangeKind.PUT, entry, entry.revision))

    async def _list(self) -> tuple[list[str], int | None]:
        """The children and pzxid of the node, re-arming the watch; ``([], None)`` if
        the node does not exist, with a watch on its creation instead."""
        conn, watches = self._conn, self._watches
        try:
            children, stat = await conn.call(
                "watch",
                lambda c: c.get_children_async(
                    self._node, watch=watches.children_watcher, include_data=True
                ),
                retry=True,
            )
        except kz.NoNodeError:
            stat = await conn.call(
                "watch",
                lambda c: c.exists_async(self._node, watch=watches.data_watcher),
                retry=True,
            )
            if stat is not None:  # created in between: list again at the next step
                self._wakeup.set()
            return [], None
        return list(children), int(stat.pzxid)

    def close(self) -> None:
        self._pending.clear()
