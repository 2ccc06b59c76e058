"""A kazoo service in a process of its own (``_kazoo_peer.py``), driven line by line."""

from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .._peer import Peer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import coord

_SCRIPT = Path(__file__).with_name("_kazoo_peer.py")


@asynccontextmanager
async def kazoo_peer(endpoint: str, session_timeout: float = 1.0) -> AsyncIterator[Peer]:
    """A kazoo client of *session_timeout* seconds' session in a process, connected."""
    argv = [sys.executable, str(_SCRIPT), endpoint, str(session_timeout)]
    async with await anyio.open_process(argv, stderr=None) as process:
        try:
            peer = Peer(process)
            assert await peer.line() == "ready"
            yield peer
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.move_on_after(5, shield=True):
                await process.wait()


def zk_path(url: str, name: str) -> str:
    """The znode path of coord's *name* under *url*'s chroot."""
    return "/" + url.rsplit("/", 1)[1] + "/" + name


async def wait_children(client: coord.Client, name: str, count: int) -> list[str]:
    """Until the lock's node *name* has *count* children (by watch); their names."""
    backend = client.backend
    while True:
        children = await backend.child_names(name + "/")
        if len(children.names) >= count:
            return list(children.names)
        await backend.wait_keys_changed(name + "/", revision=children.revision)
