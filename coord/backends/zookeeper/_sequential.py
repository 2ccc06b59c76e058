"""The nodes of the peer layouts: kazoo's and Curator's lock and election recipes.

Those recipes name their EPHEMERAL_SEQUENTIAL nodes themselves (kazoo ``recipe/lock.py``:
``<uuid4 hex>__lock__<seq>``; Curator ``CreateBuilderImpl`` in protected mode:
``_c_<uuid>-lock-<seq>``) and sort a raw listing of the parent by their own rules, so
the backend offers just that: a create under a caller's name, with the protected-mode
search after a lost reply (adopted only if its ephemeralOwner is our session,
CURATOR-498), the raw child names, a check that a node still exists, and a wait for a
change of the children. The recipes (``coord/_locks/node_layouts.py``) do the rest.
"""

from __future__ import annotations

import logging
import re
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._core.exceptions import (
    BackendUnavailable,
    ConfigurationError,
    EntryGoneError,
    SessionExpiredError,
)
from ...abc import Children, Entry, Position
from ._waitqueue import entry_of

if TYPE_CHECKING:
    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths
    from ._waitqueue import WaitQueues
    from ._watches import WatchRegistry
    from ._wire import WireClient

__all__ = ["SequentialNodes", "check_node_name"]

log = logging.getLogger("coord.backends.zookeeper")

# The sequence ZooKeeper appends (``%010d`` of the parent's cversion; kazoo's pattern
# allows the minus sign of an overflowed counter).
_SEQUENCE = re.compile(r"-?\d{10}")
# Creates whose reply was lost and whose node was not found: tried again.
_ATTEMPTS = 3


def check_node_name(name: str) -> str:
    """*name*, if it can name a peer layout's node: one path segment, not one of coord's
    waiter names (which the backend reads as its own queue's)."""
    if not name or "/" in name or name.startswith("@"):
        raise ConfigurationError(
            f"a sequential node's name is one segment, not starting with '@': {name!r}"
        )
    return name


class SequentialNodes:
    """The peer layouts' calls on one backend."""

    def __init__(
        self,
        conn: Connection,
        nodes: Nodes,
        paths: Paths,
        queues: WaitQueues,
        watches: WatchRegistry,
    ) -> None:
        self._conn = conn
        self._nodes = nodes
        self._paths = paths
        self._queues = queues
        self._watches = watches

    async def create(
        self, prefix: str, name: str, value: bytes, session_id: int, *, containers: bool
    ) -> Entry:
        node = self._paths.parent(prefix)
        for _ in range(_ATTEMPTS):
            try:
                path, stat = await self._nodes.create(
                    f"{node}/{name}", value, ephemeral=True, sequence=True, containers=containers
                )
            except BackendUnavailable:
                found = await self.find(node, name, session_id)  # protected mode
                if found is not None:
                    log.info("adopted %s/%s after a lost create reply", node, found[0])
                    return entry_of(prefix + found[0], value, found[1])
                continue
            if stat.ephemeralOwner != session_id:
                # Our session was replaced before we heard of it: no lease stands for it.
                await self._queues.delete_path(path)
                raise SessionExpiredError(f"session {session_id:#x} expired while creating")
            return entry_of(prefix + path.rpartition("/")[2], value, stat)
        raise BackendUnavailable(f"ZooKeeper create in {node}: no answer")

    async def find(self, node: str, name: str, session_id: int) -> tuple[str, Any] | None:
        """The node ``name + <sequence>`` under *node* owned by *session_id*, as
        ``(child name, stat)``; None if there is none."""
        listing = await self._queues.children(node)
        for child in sorted(listing[0] if listing else []):
            if child.startswith(name) and _SEQUENCE.fullmatch(child[len(name) :]):
                path = f"{node}/{child}"
                stat = await self._conn.call("exists", methodcaller("exists", path), retry=True)
                if stat is not None and stat.ephemeralOwner == session_id:
                    return child, stat
        return None

    async def delete_provisional(self, entry: Entry) -> bool:
        """Delete the node that a create of *entry*'s name may have made (its outcome
        unknown), if *entry*'s session owns it."""
        _, node, name = self._paths.split(entry.key)
        found = await self.find(node, name, entry.lease)
        if found is None:
            return False
        return await self._queues.delete_path(f"{node}/{found[0]}")

    async def children(self, prefix: str) -> Children:
        node = self._paths.parent(prefix) if prefix else self._paths.root or "/"
        listing = await self._queues.children(node)
        if listing is None:
            return Children((), 0)
        return Children(tuple(listing[0]), listing[1])

    async def position(self, entry: Entry) -> Position:
        """*entry* with nothing ahead, if its node is still the same one (its czxid)."""
        path = self._paths.path(entry.key)
        stat = await self._conn.call("exists", methodcaller("exists", path), retry=True)
        if stat is None or stat.czxid != entry.revision:
            raise EntryGoneError(f"{entry.key} no longer exists")
        return Position(entry, (), max(stat.czxid, stat.mzxid))

    async def wait_children_changed(self, prefix: str, revision: int) -> None:
        """Until a child of *prefix*'s node may have been created or deleted since the
        listing whose pzxid was *revision*: a children watch, or while the node is
        missing an exists watch (it fires when the node is made)."""
        node = self._paths.parent(prefix) if prefix else self._paths.root or "/"
        woken = anyio.Event()
        with (
            self._watches.listening("children", [node], woken.set),
            self._watches.listening("data", [node], woken.set),
        ):
            client = await self._conn.ready(self._conn.timeout)
            try:
                changed = await self._arm(client, node, revision)
            except Exception as exc:
                error = self._conn.translate(exc, "watch", client)
                if isinstance(error, BackendUnavailable):
                    return  # a disconnect: the caller reads again
                raise error from exc
            if not changed:
                await woken.wait()

    async def _arm(self, client: WireClient, node: str, revision: int) -> bool:
        """Arm the watch; True if the children already changed since *revision*."""
        try:
            _, stat = await client.get_children(
                node, watch=self._watches.children_watcher, include_data=True
            )
        except kz.NoNodeError:
            # Gone since the listing, or made since: either way, list again.
            made = await client.exists(node, watch=self._watches.data_watcher)
            return bool(revision) or made is not None
        return int(stat.pzxid) != revision
