"""Helpers shared by the ZooKeeper tests."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute

from coord.backends.zookeeper import ZooKeeperBackend
from coord.backends.zookeeper._wire import WireClient

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from anyio.abc import SocketStream, TaskStatus

    import coord


def backend_of(client: coord.Client) -> ZooKeeperBackend:
    backend = client.backend
    assert isinstance(backend, ZooKeeperBackend)
    return backend


@asynccontextmanager
async def raw_client(
    endpoint: str, auth: Sequence[tuple[str, str]] = ()
) -> AsyncIterator[WireClient]:
    """A plain ZooKeeper client of its own session, to look at the tree the way another
    program would."""
    host, _, port = endpoint.rpartition(":")
    async with WireClient([(host, int(port))], session_timeout=10, auth=auth) as client:
        yield client


CREATE2 = 15  # ZooKeeper's opcode of a create that returns the node's stat
_MAX_FRAME = 0xFFFFF  # ZooKeeper's jute.maxbuffer: a longer "length" is no frame


class Proxy:
    """A TCP proxy in front of a ZooKeeper server that can swallow replies and cut
    connections: a network that fails exactly where a test needs it to.

    Start it with ``await tg.start(proxy.serve)``; clients connect to :attr:`port`.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        #: While True, what the server sends is dropped (requests still go through).
        self.swallow_replies = False
        #: When a request with this opcode goes through, start swallowing replies.
        self.swallow_from_opcode: int | None = None
        self._connections: set[anyio.CancelScope] = set()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._relay)

    def cut(self) -> None:
        """Close every connection (both sides see it closed), as a network failure would."""
        for scope in self._connections:
            scope.cancel()

    async def _relay(self, client: SocketStream) -> None:
        scope = anyio.CancelScope()
        self._connections.add(scope)
        try:
            with scope:
                async with client, await anyio.connect_tcp("127.0.0.1", self.target_port) as server:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._requests, client, server, tg.cancel_scope)
                        tg.start_soon(self._replies, server, client, tg.cancel_scope)
        finally:
            self._connections.discard(scope)

    async def _requests(
        self, source: SocketStream, sink: SocketStream, pair: anyio.CancelScope
    ) -> None:
        # Frames: a 4-byte length, then (after the connect request) xid and opcode.
        buffer, first = b"", True
        try:
            async for chunk in source:
                buffer += chunk
                if first and len(buffer) >= 4 and int.from_bytes(buffer[:4]) > _MAX_FRAME:
                    await sink.send(buffer)  # a four-letter word (coord's first contact)
                    buffer = b""
                    continue
                while len(buffer) >= 4 and len(buffer) >= 4 + int.from_bytes(buffer[:4]):
                    size = 4 + int.from_bytes(buffer[:4])
                    frame, buffer = buffer[:size], buffer[size:]
                    opcode = None if first else int.from_bytes(frame[8:12], signed=True)
                    first = False
                    if opcode is not None and opcode == self.swallow_from_opcode:
                        self.swallow_replies = True
                    await sink.send(frame)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        pair.cancel()  # one side closed: close the other

    async def _replies(
        self, source: SocketStream, sink: SocketStream, pair: anyio.CancelScope
    ) -> None:
        try:
            async for chunk in source:
                if not self.swallow_replies:
                    await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        pair.cancel()
