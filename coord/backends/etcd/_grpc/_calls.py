"""The calls of the etcd transport, as grpc.aio's look to their users (aetcd's generated
stubs): a unary call is awaited for its reply; a stream is written, read (:data:`EOF` at
its end) and cancelled; a failure raises :class:`RpcError` with the status code.

A call waits for its channel to connect, runs on one stream of a connection
(``_connection._Connection``) and ends once: by the server's trailers, a reset, the
connection's loss, its deadline or its cancellation.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import grpc

from ._encode import grpc_message
from ._link import Caller, Dialer, _Link, _Stream
from ._status import EOF, OK, CallEnded, RpcError

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from ._pipe import Event
    from ._timers import Timer

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
        "_ended_event",
        "_stream",
        "cancelled_here",
    )

    def __init__(self, channel: Dialer) -> None:
        self._channel = channel
        self._conn: _Link | None = None
        self._stream: _Stream | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._ended_event: Event | None = None  # made by the first code()
        self._begun: Event | None = None  # made by the first started()
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
        if self._begun is not None:
            self._begun.set()

    async def started(self) -> None:
        """Wait until the call's stream is open (the channel connected) or it ended."""
        if self._stream is None and self._code is None:
            if self._begun is None:
                self._begun = self._channel.runtime.event()
            await self._begun.wait()

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
        if self._ended_event is not None:
            self._ended_event.set()
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
            if self._ended_event is None:
                self._ended_event = self._channel.runtime.event()
            await self._ended_event.wait()
        assert self._code is not None
        return self._code

    def _error(self) -> RpcError:
        assert self._code is not None
        return RpcError(self._code, self._details)


class UnaryCall(_Call):
    """One request, one reply: await it. A checkpoint unless it has ended; cancelled
    while awaited (an anyio scope, ``task.cancel()``, ``asyncio.timeout``), the call is
    cancelled too: its stream is reset (RST_STREAM) and nothing of it is left."""

    __slots__ = (
        "_deserialize",
        "_done",
        "_failure",
        "_refused",
        "_reply",
        "_request",
        "_result",
        "_timer",
    )

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
        self._done: Event | None = None  # made by its awaiter, if it has to wait
        self._result: Any = None
        self._failure: RpcError | None = None
        self._timer: Timer | None = (
            channel.timers.call_later(timeout, self._expire) if timeout is not None else None
        )
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

    def _message(self, data: bytes) -> None:
        if self._reply is None:
            self._reply = data

    def _finished(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._code is OK:
            if self._reply is None:
                self._failure = RpcError(grpc.StatusCode.INTERNAL, "no reply")
            else:
                try:
                    self._result = self._deserialize(self._reply)
                except Exception as exc:  # a reply that does not parse
                    self._failure = RpcError(grpc.StatusCode.INTERNAL, f"bad reply: {exc}")
        else:
            self._failure = self._error()
        if self._done is not None:
            self._done.set()

    def cancelled(self) -> bool:
        """Whether it ended by our cancellation."""
        return self.cancelled_here

    def __await__(self) -> Generator[Any, None, Any]:
        return self._outcome().__await__()

    async def _outcome(self) -> Any:
        if self._code is None:
            done = self._done = self._channel.runtime.waiter()
            try:
                await done.wait()
            except BaseException:  # the awaiting task's cancellation: the call's too
                self.cancel()
                raise
        if self._failure is not None:
            raise self._failure
        return self._result


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
        self._readable: Event | None = None
        self._open(block, None)

    def _message(self, data: bytes) -> None:
        self._replies.append(data)
        self._wake()

    def _finished(self) -> None:
        self._wake()

    def _wake(self) -> None:
        readable = self._readable
        if readable is not None:
            readable.set()

    async def write(self, request: Any) -> None:
        """Send *request* (a checkpoint). Cancelled while flow control holds it back, the
        stream is cut half-way: the caller cancels the call.

        :raises CallEnded: if the call has ended (or ends before the write went out)
        """
        await self.started()
        if self._code is not None:
            raise CallEnded("the call has ended")
        assert self._conn is not None
        assert self._stream is not None
        data = grpc_message(self._serialize(request))
        done = self._channel.runtime.waiter()
        if not self._conn.send(self._stream, data, end=False, done=done):
            await done.wait()  # held back by flow control
            if self._code is not None:
                raise CallEnded("the call ended before the write went out")

    async def read(self) -> Any:
        """The next reply; :data:`EOF` once the server ended the call well. Taking a
        reply gives its bytes back to the stream's flow-control window: the server sends
        a reader that does not read no more than a window ahead."""
        while not self._replies:
            if self._code is not None:
                if self._code is OK:
                    return EOF
                if self.cancelled_here:
                    raise CallEnded("the call was cancelled")
                raise self._error()
            self._readable = self._channel.runtime.waiter()
            await self._readable.wait()
        data = self._replies.popleft()
        if self._conn is not None and self._stream is not None:
            self._conn.credit(self._stream, len(data) + 5)  # and its gRPC prefix
        return self._deserialize(data)
