"""A scripted HTTP/2 server for the etcd transport's hostile-input tests: it listens on
127.0.0.1, sends its SETTINGS, waits for the client's request on a stream, then sends
whatever the test's script returns for that stream id, raw bytes, frame by frame as an
attacker would. It records what it read, and whether the client closed the connection."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import hpack
from aetcd import rpc

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from anyio.abc import SocketStream

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9


def h2(
    kind: int, flags: int, sid: int, payload: bytes = b"", *, length: int | None = None
) -> bytes:
    """One frame; *length* overrides the length its header states."""
    size = len(payload) if length is None else length
    return size.to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def mutated(data: bytes, mutations: list[tuple[int, int, str]]) -> bytes:
    """*data* with bytes flipped (``f``), inserted (``i``) or deleted (``d``): each
    mutation is ``(where, value, how)``, *where* taken modulo the length (for fuzzing)."""
    out = bytearray(data)
    for at, value, how in mutations:
        at %= len(out) + 1
        if how == "f" and at < len(out):
            out[at] ^= value or 1
        elif how == "i":
            out[at:at] = bytes((value,))
        elif out:
            del out[at % len(out)]
    return bytes(out)


def reply(sid: int, message: bytes | None = None) -> bytes:
    """A whole, well-formed gRPC reply on stream *sid*: headers, one message, trailers."""
    encoder = hpack.Encoder()
    head = encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
    tail = encoder.encode([(b"grpc-status", b"0")])
    body = rpc.RangeResponse().SerializeToString() if message is None else message
    grpc_message = b"\0" + len(body).to_bytes(4, "big") + body
    return h2(HEADERS, 4, sid, head) + h2(DATA, 0, sid, grpc_message) + h2(HEADERS, 5, sid, tail)


class Script:
    """What the server saw: the stream ids of the requests, and the client's goodbye."""

    def __init__(self, answer: Callable[[int], bytes]) -> None:
        self.answer = answer
        self.requests: list[int] = []
        self.resets: list[int] = []  # the streams the client reset (RST_STREAM)
        self.reset = anyio.Event()  # the client reset a stream
        self.connections = 0
        self.closed = anyio.Event()  # the client closed (or reset) a connection

    async def serve(self, stream: SocketStream) -> None:
        self.connections += 1
        buffer = b""
        async with stream:
            await self._serve(stream, buffer)

    async def _serve(self, stream: SocketStream, buffer: bytes) -> None:
        try:
            await stream.send(h2(SETTINGS, 0, 0))
            while True:
                buffer += await stream.receive()
                if buffer.startswith(PREFACE):
                    buffer = buffer[len(PREFACE) :]
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    length, kind, sid = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[5:9]
                    buffer = buffer[9 + length :]
                    if kind == HEADERS:
                        self.requests.append(int.from_bytes(sid, "big"))
                        await stream.send(self.answer(self.requests[-1]))
                    elif kind == RST_STREAM:
                        self.resets.append(int.from_bytes(sid, "big"))
                        self.reset.set()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            self.closed.set()


@asynccontextmanager
async def scripted(answer: Callable[[int], bytes]) -> AsyncIterator[tuple[int, Script]]:
    """A server answering each request with ``answer(stream_id)``: its port, its record."""
    script = Script(answer)
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, script.serve)
            try:
                yield port, script
            finally:
                tg.cancel_scope.cancel()
