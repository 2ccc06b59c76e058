"""The calls of the etcd transport, as grpc.aio's look to their users (aetcd's generated
stubs): a unary call is awaited for its reply; a stream is written, read (:data:`EOF` at
its end) and cancelled; a failure raises :class:`RpcError` with the status code.

A call waits for its channel to connect, runs on one stream of a connection
(``_connection._Connection``) and ends once: by the server's trailers, a reset, the
connection's loss, its deadline or its cancellation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

import grpc

from ._encode import grpc_message
from ._link import Caller, Dialer, _Link, _Stream
from ._status import EOF, OK, RpcError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["StreamCall", "UnaryCall"]

#: Times a unary call goes again after the server refused its stream unprocessed.
_REFUSALS = 3


class _Call(Caller):
    """What unary and stream calls share: the stream they run on, and how they end."""

    __slots__ = (
        "_begun",
        "_channel",
        "_code",
        "_conn",
        "_details",
        "_ended_future",
        "_stream",
        "cancelled_here",
    )

    def __init__(self, channel: Dialer) -> None:
        self._channel = channel
        self._conn: _Link | None = None
        self._stream: _Stream | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._ended_future: asyncio.Future[None] | None = None
        self._begun: asyncio.Future[None] | None = None  # made by the first started()
        #: Ended by our own cancel() (not by the server, the network or the channel).
        self.cancelled_here = False

    def _open(self, block: bytes, body: bytes | None) -> None:
        """Start the stream now if the channel is connected, else once it is (the
        channel keeps the call until then, and ends it if it cannot connect)."""
        self._channel._wait(self, block, body)

    def _begin(self, conn: _Link, block: bytes, body: bytes | None) -> None:
        if self._code is not None:
            return  # cancelled (or timed out) while it waited for the connection
        if conn.error is not None:  # lost while we waited for our turn to run
            self._ended(conn.error.code(), conn.error.details() or "")
            return
        if conn.draining:  # going away: on the next connection
            self._channel._wait(self, block, body)
            return
        self._conn = conn
        conn.start(self, block, body)

    def _on_stream(self, stream: _Stream) -> None:
        """The connection opened the call's stream (at once, or once it had room)."""
        self._stream = stream
        self._started()

    def _started(self) -> None:
        if self._begun is not None and not self._begun.done():
            self._begun.set_result(None)

    async def started(self) -> None:
        """Wait until the call's stream is open (the channel connected) or it ended."""
        if self._stream is None and self._code is None:
            if self._begun is None:
                self._begun = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._begun)

    def _message(self, data: bytes) -> None:
        raise NotImplementedError

    def _again(self) -> bool:
        """The server refused the call's stream before processing it (over its limit
        of streams): start it again if that can be done; whether it was."""
        return False

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        if self._code is not None:
            return
        self._code, self._details = code, details
        if self._ended_future is not None and not self._ended_future.done():
            self._ended_future.set_result(None)
        self._started()
        self._finished()

    def _finished(self) -> None:
        """The call has ended (its code is set)."""

    def cancel(self) -> bool:
        """Cancel the call (RST_STREAM): False if it had already ended."""
        if self._code is not None:
            return False
        self.cancelled_here = True
        self._ended(grpc.StatusCode.CANCELLED, "cancelled by the client")
        if self._conn is not None and self._stream is not None:
            self._conn.reset(self._stream)
        return True

    def done(self) -> bool:
        return self._code is not None

    async def code(self) -> grpc.StatusCode:
        """Wait for the call's end; its status code."""
        if self._code is None:
            if self._ended_future is None:
                self._ended_future = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._ended_future)
        assert self._code is not None
        return self._code

    def _error(self) -> RpcError:
        assert self._code is not None
        return RpcError(self._code, self._details)


class UnaryCall(_Call):
    """One request, one reply: await it."""

    __slots__ = ("_deserialize", "_future", "_refused", "_reply", "_request", "_timer")

    def __init__(
        self,
        channel: Dialer,
        block: bytes,
        body: bytes,
        deserialize: Callable[[bytes], Any],
        timeout: float | None,
    ) -> None:
        super().__init__(channel)
        self._deserialize = deserialize
        self._request = (block, body)
        self._refused = 0
        self._reply: bytes | None = None
        loop = asyncio.get_running_loop()
        self._future: asyncio.Future[Any] = loop.create_future()
        # Cancelled by its awaiting task's cancellation: then the call is cancelled too.
        self._future.add_done_callback(self._awaited_done)
        self._timer = loop.call_later(timeout, self._expire) if timeout is not None else None
        self._open(block, body)

    def _again(self) -> bool:
        if self._code is not None or self._refused >= _REFUSALS:
            return False
        self._refused += 1
        self._conn = self._stream = None
        self._reply = None
        self._channel._wait(self, *self._request)
        return True

    def _expire(self) -> None:
        self._timer = None
        if self._code is None:
            self._ended(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            if self._conn is not None and self._stream is not None:
                self._conn.reset(self._stream)

    def _awaited_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.cancel()

    def _message(self, data: bytes) -> None:
        if self._reply is None:
            self._reply = data

    def _finished(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        future = self._future
        if future.done():
            return
        if self._code is OK:
            if self._reply is None:
                future.set_exception(RpcError(grpc.StatusCode.INTERNAL, "no reply"))
                return
            try:
                future.set_result(self._deserialize(self._reply))
            except Exception as exc:  # a reply that does not parse
                future.set_exception(RpcError(grpc.StatusCode.INTERNAL, f"bad reply: {exc}"))
        elif self.cancelled_here:
            future.cancel()
        else:
            future.set_exception(self._error())

    def cancelled(self) -> bool:
        """Whether it ended by our cancellation."""
        return self.cancelled_here

    def add_done_callback(self, callback: Callable[[UnaryCall], None]) -> None:
        self._future.add_done_callback(lambda _: callback(self))

    def __await__(self) -> Any:
        return self._future.__await__()


class StreamCall(_Call):
    """A bidirectional stream: write requests, read replies (:data:`EOF` at its end)."""

    __slots__ = ("_deserialize", "_readable", "_replies", "_serialize")

    holds_replies = True

    def __init__(
        self,
        channel: Dialer,
        block: bytes,
        serialize: Callable[[Any], bytes],
        deserialize: Callable[[bytes], Any],
    ) -> None:
        super().__init__(channel)
        self._serialize = serialize
        self._deserialize = deserialize
        self._replies: deque[bytes] = deque()
        self._readable: asyncio.Future[None] | None = None
        self._open(block, None)

    def _message(self, data: bytes) -> None:
        self._replies.append(data)
        self._wake()

    def _finished(self) -> None:
        self._wake()

    def _wake(self) -> None:
        readable = self._readable
        if readable is not None and not readable.done():
            readable.set_result(None)

    async def write(self, request: Any) -> None:
        """Send *request*. Raises ``asyncio.InvalidStateError`` if the call has ended."""
        await self.started()
        if self._code is not None:
            raise asyncio.InvalidStateError("the call has ended")
        assert self._conn is not None
        assert self._stream is not None
        data = grpc_message(self._serialize(request))
        done = asyncio.get_running_loop().create_future()
        if not self._conn.send(self._stream, data, end=False, done=done):
            await done  # held back by flow control
            if self._code is not None:
                raise asyncio.InvalidStateError("the call ended before the write went out")

    async def read(self) -> Any:
        """The next reply; :data:`EOF` once the server ended the call well. Taking a
        reply gives its bytes back to the stream's flow-control window: the server sends
        a reader that does not read no more than a window ahead."""
        while not self._replies:
            if self._code is not None:
                if self._code is OK:
                    return EOF
                if self.cancelled_here:
                    raise asyncio.CancelledError
                raise self._error()
            self._readable = asyncio.get_running_loop().create_future()
            await self._readable
        data = self._replies.popleft()
        if self._conn is not None and self._stream is not None:
            self._conn.credit(self._stream, len(data) + 5)  # and its gRPC prefix
        return self._deserialize(data)
