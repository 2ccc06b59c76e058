"""``Backend.watch`` on ZooKeeper: a children watch on the prefix's node, re-armed after
every event, turned into PUT / DELETE changes by comparing successive listings.

ZooKeeper keeps no history: a watch cannot start "at a revision" as on etcd. Instead
the first listing compares the node's *pzxid* (the zxid of the last change to its
children) with the revision the caller read at: if the children changed since, the
changes cannot all be named (deleted children leave no trace), so the iteration raises
:exc:`coord.ResyncNeeded` at once and the caller reads again. Between two listings the
node's *cversion* (its count of child changes) says whether the difference of the two
listings explains every change: a child that came and went unseen cannot be named, and
ResyncNeeded is raised after the changes that can. Only waiter entries are reported (not
nested names' nodes). Data changes of children are not watched (the contract asks for
creations and deletions only).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import anyio
from kazoo import exceptions as kz

from ..._exceptions import ResyncNeeded
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
        self._known: set[str] = set()  # the waiter children
        self._children: set[str] = set()  # every child
        self._cversion = 0
        self._pending: deque[Change] = deque()
        self._wakeup = anyio.Event()
        self._lost = False

    def wake(self) -> None:
        self._wakeup.set()

    @property
    def node(self) -> str:
        return self._node

    async def start(self, revision: int) -> None:
        """First listing: report what changed after *revision*."""
        self._wakeup = anyio.Event()
        children, pzxid, self._cversion = await self._list()
        self._children = set(children)
        self._known = {name for name in children if parse_waiter(name) is not None}
        # No node while the caller saw children, or children changed since the caller's
        # read: what changed cannot be named.
        self._lost = (pzxid is None and revision > 0) or (pzxid is not None and pzxid > revision)

    def __aiter__(self) -> ChildChanges:
        return self

    async def __anext__(self) -> Change:
        if self._lost and not self._pending:
            raise ResyncNeeded(
                f"ZooKeeper: the children of {self._node} changed since the revision asked "
                "for, and ZooKeeper keeps no history of them"
            )
        while not self._pending:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()  # events from now on call for another listing
            await self._relist()
            if self._lost and not self._pending:
                return await self.__anext__()
        return self._pending.popleft()

    async def _relist(self) -> None:
        children, pzxid, cversion = await self._list()
        everything = set(children)
        named = len(everything ^ self._children)
        if pzxid is not None and cversion - self._cversion > named:
            self._lost = True  # children came and went between the two listings
        self._children, self._cversion = everything, cversion
        current = {name for name in children if parse_waiter(name) is not None}
        pzxid = pzxid or 0
        gone = sorted(self._known - current, key=_order)
        new = sorted(current - self._known, key=_order)
        self._known = current
        self._pending.extend(
            Change(ChangeKind.DELETE, Entry(self._prefix + name), pzxid) for name in gone
        )
        for entry in await self._queues.existing(self._prefix, new):
            self._pending.append(Change(ChangeKind.PUT, entry, entry.revision))

    async def _list(self) -> tuple[list[str], int | None, int]:
        """The children, pzxid and cversion of the node, re-arming the watch; ``([],
        None, 0)`` if the node does not exist, with a watch on its creation instead."""
        conn, watches = self._conn, self._watches
        try:
            children, stat = await conn.call(
                "watch",
                lambda c: c.get_children(
                    self._node, watch=watches.children_watcher, include_data=True
                ),
                retry=True,
            )
        except kz.NoNodeError:
            stat = await conn.call(
                "watch",
                lambda c: c.exists(self._node, watch=watches.data_watcher),
                retry=True,
            )
            if stat is not None:  # created in between: list again at the next step
                self._wakeup.set()
            return [], None, 0
        return list(children), int(stat.pzxid), int(stat.cversion)

    def close(self) -> None:
        self._pending.clear()
