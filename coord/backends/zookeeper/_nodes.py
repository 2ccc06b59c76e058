"""Creating nodes: parents as containers, waiter nodes with their listing in one trip.

* Parents are created as CONTAINER nodes (ZooKeeper 3.5+), which the server deletes once
  their last child is gone, so lock parents never pile up (the wire client's
  ``create(container=True)``, opcode 19); on a server without containers (before 3.5),
  parents are persistent and the backend prunes them when it deletes their last waiter.
* A waiter node is created with a listing (and reads) pipelined right behind it:
  ZooKeeper runs one session's requests in the order sent, so the listing already
  contains the new node, and all the answers come back in one round trip.
"""

from __future__ import annotations

import logging
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._core.exceptions import BackendError, BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._connection import Connection
    from ._paths import Paths
    from ._wire import Reply

__all__ = ["Nodes"]

log = logging.getLogger("coord.backends.zookeeper")

# A parent may be reaped by the server (an empty container) between our creating it and
# creating a child in it; then we create it again, a bounded number of times.
_PARENT_ATTEMPTS = 5


async def _listing(reply: Reply) -> tuple[list[str], int] | None:
    try:
        children, stat = await reply.wait()
    except Exception:  # e.g. the connection dropped right after the create
        return None
    return list(children), int(stat.pzxid)


async def _values(replies: dict[str, Reply]) -> dict[str, Any]:
    values = {}
    for path, reply in replies.items():
        try:
            values[path] = await reply.wait()
        except kz.NoNodeError:
            values[path] = None  # gone: known not to exist
        except Exception:
            continue  # unknown: the caller reads it again
    return values


class Nodes:
    """Node creation on one connection."""

    def __init__(self, conn: Connection, paths: Paths) -> None:
        self._conn = conn
        self._paths = paths
        #: False once the server answered that it has no container nodes (before 3.5).
        self.containers = True

    async def create(
        self,
        path: str,
        value: bytes,
        *,
        ephemeral: bool = False,
        sequence: bool = False,
        containers: bool = True,
    ) -> tuple[str, Any]:
        """Create a node, and its missing parents as containers (persistent nodes with
        ``containers=False``); return ``(path, stat)``.

        Not retried after a connection loss (it may have happened).
        """
        for _ in range(_PARENT_ATTEMPTS):
            try:
                return await self._conn.call(  # type: ignore[no-any-return]
                    "create",
                    lambda c: c.create(
                        path, value, self._conn.acl, ephemeral=ephemeral, sequence=sequence
                    ),
                )
            except kz.NoNodeError:
                await self.ensure_parents(path, containers=containers)
        raise BackendError(f"ZooKeeper create {path}: its parent keeps disappearing")

    async def create_and_list(
        self,
        path: str,
        value: bytes,
        node: str,
        reads: Sequence[str] = (),
        *,
        ephemeral: bool = True,
    ) -> tuple[str, Any, tuple[list[str], int] | None, dict[str, Any]]:
        """Create a SEQUENTIAL node (ephemeral unless told) under *node*, list *node*'s children and
        read the nodes *reads*, in one round trip: ZooKeeper runs a session's requests in
        the order sent, so the listing sent right behind the create contains the new node.

        Returns ``(path, stat, (children, pzxid), {read path: (data, stat)})``; the
        listing is None, and a read is missing, if it failed (the caller asks again).
        Not retried after a connection loss.
        """
        for _ in range(_PARENT_ATTEMPTS):
            with anyio.move_on_after(self._conn.timeout):
                client = await self._conn.ready(self._conn.timeout)
                created = client.create_nowait(
                    path, value, self._conn.acl, ephemeral=ephemeral, sequence=True
                )
                listed = client.get_children_nowait(node)
                got = {p: client.get_data_nowait(p) for p in reads}
                try:
                    new_path, stat = await created.wait()
                except kz.NoNodeError:
                    await self.ensure_parents(path)
                    continue
                except Exception as exc:
                    raise self._conn.translate(exc, "create", client) from exc
                return new_path, stat, await _listing(listed), await _values(got)
            raise BackendUnavailable(f"ZooKeeper create in {node}: no answer")
        raise BackendError(f"ZooKeeper create {path}: its parent keeps disappearing")

    async def ensure_parents(self, path: str, *, containers: bool = True) -> None:
        """Create the missing ancestors of *path*, deepest existing one first."""
        missing: list[str] = []
        for ancestor in reversed(self._paths.ancestors(path)):
            try:
                await self._create_parent(ancestor, containers)
            except kz.NoNodeError:
                missing.append(ancestor)
                continue
            break
        for ancestor in reversed(missing):
            await self._create_parent(ancestor, containers)

    async def _create_parent(self, path: str, containers: bool = True) -> None:
        try:
            if self.containers and containers:
                try:
                    await self._conn.call(
                        "create container",
                        lambda c: c.create(path, b"", self._conn.acl, container=True),
                    )
                    return
                except BackendError as exc:
                    if not isinstance(exc.__cause__, kz.UnimplementedError):
                        raise
                    log.warning("ZooKeeper has no container nodes (before 3.5)")
                    self.containers = False
            await self._conn.call("create parent", lambda c: c.create(path, b"", self._conn.acl))
        except kz.NodeExistsError:
            pass

    async def prune(self, path: str) -> None:
        """Delete the empty ancestors of *path*, bottom up (servers without containers).

        Best effort: stops at the first ancestor that is not empty or cannot be deleted.
        """
        for ancestor in reversed(self._paths.ancestors(path)):
            try:
                await self._conn.call("prune", methodcaller("delete", ancestor))
            except (kz.NotEmptyError, kz.NoNodeError, BackendError):
                return
