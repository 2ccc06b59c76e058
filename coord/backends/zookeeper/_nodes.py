"""Creating nodes: parents as containers, waiter nodes with their listing in one trip.

* Parents are created as CONTAINER nodes (ZooKeeper 3.5+), which the server deletes once
  their last child is gone, so lock parents never pile up. kazoo has no API for them, so
  coord sends the createContainer request (opcode 19) through kazoo's request queue; on a
  server without containers (before 3.5), parents are persistent and the backend prunes
  them when it deletes their last waiter.
* A waiter node is created with a listing (and reads) pipelined right behind it:
  ZooKeeper runs one session's requests in the order sent, so the listing already
  contains the new node, and all the answers come back in one round trip.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz
from kazoo.protocol.serialization import Create2

from ..._exceptions import BackendError, BackendUnavailable
from ._kazoo import queue_request

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._bridge import Reply
    from ._connection import Connection
    from ._paths import Paths

__all__ = ["Nodes"]

log = logging.getLogger("coord.backends.zookeeper")

_CONTAINER_FLAG = 4
# A parent may be reaped by the server (an empty container) between our creating it and
# creating a child in it; then we create it again, a bounded number of times.
_PARENT_ATTEMPTS = 5


def _delete(client: Any, path: str) -> Any:
    return client.delete_async(path)


async def _listing(reply: Reply) -> tuple[list[str], int] | None:
    try:
        children, stat = await reply.result()
    except Exception:  # e.g. the connection dropped right after the create
        return None
    return list(children), int(stat.pzxid)


async def _values(replies: dict[str, Reply]) -> dict[str, Any]:
    values = {}
    for path, reply in replies.items():
        try:
            values[path] = await reply.result()
        except kz.NoNodeError:
            values[path] = None  # gone: known not to exist
        except Exception:
            continue  # unknown: the caller reads it again
    return values


class _CreateContainer(Create2):  # type: ignore[misc]  # kazoo is untyped
    """ZooKeeper's createContainer request: a Create2 with its own opcode."""

    __slots__ = ()
    type = 19


class Nodes:
    """Node creation on one connection."""

    def __init__(self, conn: Connection, paths: Paths) -> None:
        self._conn = conn
        self._paths = paths
        #: False once the server answered that it has no container nodes (before 3.5).
        self.containers = True

    async def create(
        self, path: str, value: bytes, *, ephemeral: bool = False, sequence: bool = False
    ) -> tuple[str, Any]:
        """Create a node, and its missing parents as containers; return ``(path, stat)``.

        Not retried after a connection loss (it may have happened).
        """
        for _ in range(_PARENT_ATTEMPTS):
            try:
                return await self._conn.call(  # type: ignore[no-any-return]
                    "create",
                    lambda c: c.create_async(
                        path,
                        value,
                        acl=self._conn.acl,
                        ephemeral=ephemeral,
                        sequence=sequence,
                        include_data=True,
                    ),
                )
            except kz.NoNodeError:
                await self.ensure_parents(path)
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
                client = await self._conn.current(self._conn.timeout)
                created = self._conn.start(
                    partial(self._create_request, client, path, value, ephemeral)
                )
                listed = self._conn.start(
                    partial(client.get_children_async, node, include_data=True)
                )
                got = {p: self._conn.start(partial(client.get_async, p)) for p in reads}
                try:
                    new_path, stat = await created.result()
                except kz.NoNodeError:
                    await self.ensure_parents(path)
                    continue
                except Exception as exc:
                    raise self._conn.translate(exc, "create", client) from exc
                return new_path, stat, await _listing(listed), await _values(got)
            raise BackendUnavailable(f"ZooKeeper create in {node}: no answer")
        raise BackendError(f"ZooKeeper create {path}: its parent keeps disappearing")

    def _create_request(self, client: Any, path: str, value: bytes, ephemeral: bool) -> Any:
        return client.create_async(
            path, value, acl=self._conn.acl, ephemeral=ephemeral, sequence=True, include_data=True
        )

    async def ensure_parents(self, path: str) -> None:
        """Create the missing ancestors of *path*, deepest existing one first."""
        missing: list[str] = []
        for ancestor in reversed(self._paths.ancestors(path)):
            try:
                await self._create_parent(ancestor)
            except kz.NoNodeError:
                missing.append(ancestor)
                continue
            break
        for ancestor in reversed(missing):
            await self._create_parent(ancestor)

    async def _create_parent(self, path: str) -> None:
        try:
            if self.containers:
                try:
                    await self._conn.call("create container", lambda c: self._container(c, path))
                    return
                except BackendError as exc:
                    if not isinstance(exc.__cause__, kz.UnimplementedError):
                        raise
                    log.warning("coord: ZooKeeper has no container nodes (before 3.5)")
                    self.containers = False
            await self._conn.call(
                "create parent", lambda c: c.create_async(path, b"", acl=self._conn.acl)
            )
        except kz.NodeExistsError:
            pass

    def _container(self, client: Any, path: str) -> Any:  # on the submitter thread
        if not hasattr(client, "_call"):  # a kazoo without the private request queue
            raise kz.UnimplementedError()
        result = client.handler.async_result()
        queue_request(client, _CreateContainer(path, b"", self._conn.acl, _CONTAINER_FLAG), result)
        return result

    async def prune(self, path: str) -> None:
        """Delete the empty ancestors of *path*, bottom up (servers without containers).

        Best effort: stops at the first ancestor that is not empty or cannot be deleted.
        """
        for ancestor in reversed(self._paths.ancestors(path)):
            try:
                await self._conn.call("prune", partial(_delete, path=ancestor))
            except (kz.NotEmptyError, kz.NoNodeError, BackendError):
                return
