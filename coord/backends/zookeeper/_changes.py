"""``Backend.watch`` on ZooKeeper: a children watch on the prefix's node, re-armed after
every event, turned into PUT / DELETE changes by comparing successive listings.

ZooKeeper keeps no history: a watch cannot start "at a revision" as on etcd. Instead
the first listing compares the *pzxid* of the node and its shards (the zxid of the last
change to their children; ``entries`` reads the same) with the revision the caller read
at: if the children changed since, the
changes cannot all be named (deleted children leave no trace), so the iteration raises
:exc:`coord.ResyncNeeded` at once and the caller reads again. Between two listings the
node's *cversion* (its count of child changes) says whether the difference of the two
listings explains every change: a child that came and went unseen cannot be named, and
ResyncNeeded is raised after the changes that can. Only waiter entries are reported (not
nested names' nodes). Data changes of children are not watched (the contract asks for
creations and deletions only).

A long queue's waiter nodes may be in shards (``_waitqueue.py``): each shard directory is
listed and watched too, and its cversion accounted the same way (a shard that appears
with changes unseen, or disappears, means ResyncNeeded). A waiter is known by its
sequence number: its move into a shard is not a change.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._core.exceptions import ResyncNeeded
from ...abc import Change, ChangeKind, Entry
from ._paths import is_sharded, parse_waiter, shard_index

if TYPE_CHECKING:
    from ._connection import Connection
    from ._paths import Paths
    from ._waitqueue import WaitQueues
    from ._watches import WatchRegistry

__all__ = ["ChildChanges"]


class ChildChanges:
    """The changes of one prefix, change by change (an iterator, not a generator, so
    that leaving the ``async for`` early leaves nothing to finalize)."""

    def __init__(
        self,
        conn: Connection,
        queues: WaitQueues,
        watches: WatchRegistry,
        paths: Paths,
        prefix: str,
    ) -> None:
        self._conn = conn
        self._queues = queues
        self._watches = watches
        self._prefix = prefix
        self._node = paths.parent(prefix)
        self._known: dict[int, str] = {}  # the waiter nodes, by sequence number
        self._children: dict[str, set[str]] = {}  # every child, by directory ("": the node)
        self._cversions: dict[str, int] = {}
        self._listened: set[str] = set()  # shard directories whose children watch is ours
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
        children, pzxid, self._cversions = await self._list()
        self._children = children
        self._known = _waiters(children)
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
        children, pzxid, cversions = await self._list()
        for directory in self._cversions.keys() | cversions.keys():
            before, now = self._children.get(directory), children.get(directory)
            if pzxid is None:
                continue
            if before is None or now is None:  # the node, or a shard, came or went
                unseen = before is not None or cversions[directory] > len(now or ())
                self._lost = self._lost or unseen
                continue
            if cversions[directory] - self._cversions[directory] > len(before ^ now):
                self._lost = True  # children came and went between the two listings
        self._children, self._cversions = children, cversions
        current = _waiters(children)
        pzxid = pzxid or 0
        gone = sorted(self._known.keys() - current.keys())
        new = sorted(current.keys() - self._known.keys())
        self._pending.extend(
            Change(ChangeKind.DELETE, Entry(self._prefix + self._known[s]), pzxid) for s in gone
        )
        self._known = current
        for entry in await self._queues.existing(self._prefix, [current[s] for s in new]):
            self._pending.append(Change(ChangeKind.PUT, entry, entry.revision))

    async def _list(self) -> tuple[dict[str, set[str]], int | None, dict[str, int]]:
        """The children and cversion of the node and of each of its shards, by directory
        ("" for the node), and the newest pzxid of them all, re-arming the watches;
        ``({}, None, {})`` if the node does not exist, with a watch on its creation
        instead."""
        conn, watches = self._conn, self._watches
        try:
            children, stat = await self._list_one(self._node)
        except kz.NoNodeError:
            stat = await conn.call(
                "watch",
                lambda c: c.exists(self._node, watch=watches.data_watcher),
                retry=True,
            )
            if stat is not None:  # created in between: list again at the next step
                self._wakeup.set()
            return {}, None, {}
        listed = {"": set(children)}
        cversions = {"": int(stat.cversion)}
        pzxid = int(stat.pzxid)
        for directory in sorted(c for c in children if shard_index(c) is not None):
            path = f"{self._node}/{directory}"
            if path not in self._listened:  # listen first (CURATOR-527)
                self._listened.add(path)
                watches.add("children", path, self.wake)
            try:
                below, shard = await self._list_one(path)
            except kz.NoNodeError:
                continue  # reaped in between
            listed[directory] = set(below)
            cversions[directory] = int(shard.cversion)
            pzxid = max(pzxid, int(shard.pzxid))  # a change in a shard is the queue's
        return listed, pzxid, cversions

    async def _list_one(self, path: str) -> tuple[list[str], Any]:
        watcher = self._watches.children_watcher
        return await self._conn.call(  # type: ignore[no-any-return]
            "watch",
            lambda c: c.get_children(path, watch=watcher, include_data=True),
            retry=True,
        )

    def close(self) -> None:
        self._pending.clear()
        for path in self._listened:
            self._watches.discard("children", path, self.wake)
        self._listened.clear()


def _waiters(children: dict[str, set[str]]) -> dict[int, str]:
    """The waiter nodes among the listed *children*, by sequence number (a node moved
    into its shard between two listings is known by its name there)."""
    found: dict[int, str] = {}
    for names in children.values():
        for name in names:
            waiter = parse_waiter(name)
            if waiter is not None and (waiter.sequence not in found or is_sharded(name)):
                found[waiter.sequence] = name
    return found
