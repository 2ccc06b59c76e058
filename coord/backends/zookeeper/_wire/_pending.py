"""The requests in flight on one connection, in the order they were sent.

ZooKeeper answers a connection's requests in order: the next reply is for the oldest
request in flight, and its xid must say so; anything else is a :class:`ProtocolError`.
A caller waits on its :class:`Reply`; the reader resolves it. A caller that stops waiting
(cancelled) leaves its entry in place: the reply still arrives, in its turn, and is
dropped, so the replies after it still match.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import anyio.lowlevel

from ._errors import ProtocolError

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._watches import Arming

__all__ = ["InFlight", "Reply", "Sent"]

log = logging.getLogger("coord.backends.zookeeper")

_MAX_XID = 2**31 - 1


class Reply:
    """The outcome of one request, resolved once by the connection's reader.

    :ivar convert: applied to the value when it is resolved (a chroot stripped...)
    :ivar on_resolved: called as ``on_resolved(value, error)`` when it is resolved, in the
        task that resolves it (the reader): it must not block or await. A failing
        callback is logged, never raised into the reader.
    """

    __slots__ = ("_done", "_error", "_event", "_value", "convert", "on_resolved")

    def __init__(self) -> None:
        # Made by the first wait before the answer: most answers of pipelined reads are
        # in by the time they are waited for (an anyio Event a request, with its lookup of
        # the async library, was a few per cent of a busy queue's client CPU).
        self._event: anyio.Event | None = None
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self.convert: Callable[[Any], Any] | None = None
        self.on_resolved: Callable[[Any, BaseException | None], object] | None = None

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome (later calls are ignored). Not a checkpoint."""
        if self._done:
            return
        if error is None and self.convert is not None:
            value = self.convert(value)
        self._value, self._error, self._done = value, error, True
        if self._event is not None:
            self._event.set()
        if self.on_resolved is not None:
            try:
                self.on_resolved(value, error)
            except Exception:
                log.exception("a ZooKeeper reply callback failed")

    @property
    def resolved(self) -> bool:
        return self._done

    async def wait(self) -> Any:
        """The value, or raise the error. A checkpoint; cancelling it abandons the wait,
        not the request (the server may still apply it)."""
        if self._done:
            await anyio.lowlevel.checkpoint()
        else:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Sent(NamedTuple):
    """A request in flight: its xid, its record, its watch (if any), its reply."""

    xid: int
    request: Any
    arming: Arming | None
    reply: Reply


class InFlight:
    """The xids of one connection and the requests awaiting their answer."""

    __slots__ = ("_queue", "_xid")

    def __init__(self) -> None:
        self._xid = 0
        self._queue: deque[Sent] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, request: Any, arming: Arming | None = None) -> Sent:
        """Give *request* the next xid and queue it (before its packet is written)."""
        self._xid = self._xid % _MAX_XID + 1
        sent = Sent(self._xid, request, arming, Reply())
        self._queue.append(sent)
        return sent

    def pop(self, xid: int) -> Sent:
        """The oldest request in flight, which the reply of *xid* must answer.

        :raises ProtocolError: if nothing is in flight or the oldest has another xid
        """
        if not self._queue:
            raise ProtocolError(f"a reply (xid {xid}) to no request")
        if self._queue[0].xid != xid:
            raise ProtocolError(f"a reply out of order: xid {xid}, {self._queue[0].xid} expected")
        return self._queue.popleft()

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Settle every request in flight with a new ``error()`` (the connection is gone)."""
        queue, self._queue = self._queue, deque()
        for sent in queue:
            sent.reply.resolve(error=error())
