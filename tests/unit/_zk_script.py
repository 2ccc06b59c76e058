"""A scripted ZooKeeper server on loopback, for the wire client's tests: each connection
is answered by a step of a script (a coroutine given the connection's :class:`Peer`),
so that a test makes the server do what a real one rarely does on demand."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, TypeAlias

import anyio
from anyio.abc import SocketAttribute
from kazoo.protocol.serialization import GetData, stat_struct

from coord.backends.zookeeper._wire._framing import FrameBuffer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import SocketStream, TaskStatus

__all__ = ["PASSWORD", "STAT", "Peer", "Script", "ScriptedServer", "Step", "serve", "start"]

PASSWORD = bytes(range(16))
STAT = stat_struct.pack(5, 5, 0, 0, 0, 0, 0, 0, 4, 0, 5)


class Peer:
    """One client connection, seen from the scripted server."""

    def __init__(self, stream: SocketStream, received: bytes = b"") -> None:
        self.stream = stream
        self._buffer = FrameBuffer()
        self._frames: list[bytes] = self._buffer.feed(received)

    async def frame(self) -> bytes:
        while not self._frames:
            self._frames.extend(self._buffer.feed(await self.stream.receive()))
        return self._frames.pop(0)

    async def connect(
        self, *, session_id: int = 0x1234, timeout_ms: int = 3000, read_only: bool = False
    ) -> tuple[int, int]:
        """Read the ConnectRequest and answer it; return its (session id, last zxid)."""
        request = await self.frame()
        _, last_zxid, _, asked_session = struct.unpack_from("!iqiq", request)
        body = struct.pack("!iiqi", 0, timeout_ms, session_id, 16) + PASSWORD
        body += bytes([read_only])
        await self.stream.send(struct.pack("!i", len(body)) + body)
        return asked_session, last_zxid

    async def request(self) -> tuple[int, int, bytes]:
        """The next request other than a ping: (xid, opcode, body)."""
        while True:
            packet = await self.frame()
            xid, opcode = struct.unpack_from("!ii", packet)
            if xid != -2:
                return xid, opcode, packet[8:]

    async def reply(self, xid: int, body: bytes = b"", *, err: int = 0, zxid: int = 9) -> None:
        payload = struct.pack("!iqi", xid, zxid, err) + body
        await self.stream.send(struct.pack("!i", len(payload)) + payload)

    async def serve_requests(self) -> None:
        """Answer pings and GetData requests ("data" and a stat) until the end."""
        while True:
            packet = await self.frame()
            xid, opcode = struct.unpack_from("!ii", packet)
            if xid == -2:
                await self.reply(-2)
            elif opcode == GetData.type:
                await self.reply(xid, struct.pack("!i", 4) + b"data" + STAT)
            else:
                await self.reply(xid)


Step: TypeAlias = "Callable[[Peer], Awaitable[None]]"
Script: TypeAlias = list[Step]


class ScriptedServer:
    """Answers its n-th connection with ``script[n]`` (the last one from then on).

    A connection that opens with the ``isro`` four-letter word (coord's first contact)
    is answered ``rw`` and closed, as ZooKeeper does, and takes no step of the script.
    """

    def __init__(self, script: Script) -> None:
        self.script = script
        self.port = 0
        self.connections = 0

    async def serve(self, *, task_status: TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                first = await stream.receive()
                if first.startswith(b"isro"):
                    await stream.send(b"rw")
                    return
                step = self.script[min(self.connections, len(self.script) - 1)]
                self.connections += 1
                await step(Peer(stream, first))
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass


async def start(tasks: anyio.abc.TaskGroup, *script: Step) -> ScriptedServer:
    """A server running *script* in *tasks*, listening once this returns."""
    server = ScriptedServer(list(script))
    await tasks.start(server.serve)
    return server


async def serve(peer: Peer) -> None:
    """A well-behaved session: the handshake, then every request answered."""
    await peer.connect()
    await peer.serve_requests()
