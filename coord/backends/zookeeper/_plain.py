"""Plain keys: persistent nodes (ephemeral when bound to the session), versioned by
their data version."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kazoo import exceptions as kz

from ..._core.exceptions import BackendUnavailable
from ._waitqueue import entry_of

if TYPE_CHECKING:
    from ...abc import Entry
    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths

__all__ = ["PlainKeys"]

# A put whose create or set got no answer is tried again (it is safe to repeat).
_PUT_ATTEMPTS = 3


class PlainKeys:
    """``put`` and ``compare_and_set`` of one backend (``get`` is a queue read)."""

    def __init__(self, conn: Connection, nodes: Nodes, paths: Paths) -> None:
        self._conn = conn
        self._nodes = nodes
        self._paths = paths

    async def put(self, key: str, value: bytes, *, ephemeral: bool) -> Entry:
        """Create *key*, or set its data if it exists (any version)."""
        path = self._paths.path(key)
        for _ in range(_PUT_ATTEMPTS):
            try:
                _, stat = await self._nodes.create(path, value, ephemeral=ephemeral)
                return entry_of(key, value, stat)
            except kz.NodeExistsError:
                pass
            except BackendUnavailable:
                continue  # perhaps created: the next attempt finds it and sets it
            try:
                stat = await self._conn.call(
                    "set", lambda c: c.set_data(path, value, -1), retry=True
                )
                return entry_of(key, value, stat)
            except kz.NoNodeError:
                continue  # deleted in between: create it again
        raise BackendUnavailable(f"ZooKeeper put {key}: no answer")

    async def compare_and_set(
        self, key: str, value: bytes, version: int | None, *, ephemeral: bool
    ) -> Entry | None:
        """Create *key* (*version* None) or set it if its data version is *version*;
        None if the comparison failed. Not repeated after a connection loss."""
        path = self._paths.path(key)
        try:
            if version is None:
                _, stat = await self._nodes.create(path, value, ephemeral=ephemeral)
            else:
                stat = await self._conn.call("set", lambda c: c.set_data(path, value, version))
        except (kz.NodeExistsError, kz.BadVersionError, kz.NoNodeError):
            return None
        return entry_of(key, value, stat)
