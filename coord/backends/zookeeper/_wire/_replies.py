"""What a connection's incoming frames mean: replies matched to requests, watch events,
auth answers. No I/O: the connection's reader feeds it one frame at a time.

Every field the server sends is checked before anything acts on it, so that a bad byte
from a peer is a :class:`~._errors.ProtocolError` (the connection is dropped and its
requests fail with ``ConnectionLoss``), never a raw ``struct.error`` or ``TypeError``
in the reader or in a caller:

* the header (:func:`~._framing.reply_header`) and the xid: a request's reply must
  answer the oldest request in flight (:class:`~._pending.InFlight`); a negative xid
  must be one of the protocol's own;
* the body, decoded by the request's record; kazoo's codec reads a string of length -1
  as None, which only a node's data may be (and ``exists`` answers None for "no
  node"): a null path or child name is refused (it would otherwise fail later, in a
  caller's code or a watch's);
* a watch event: its path must be a path. An event for a path with no watch of ours
  is ignored, as ZooKeeper's Java client does (a watch re-armed with SetWatches may
  fire after the caller stopped caring).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz
from kazoo.protocol.serialization import Exists, GetChildren2, GetData, Watch

from ._errors import ProtocolError, error_for
from ._framing import (
    AUTH_XID,
    DECODE_ERRORS,
    PING_XID,
    REPLY_HEADER_SIZE,
    SET_WATCHES_XID,
    WATCH_XID,
    reply_header,
)
from ._pending import InFlight, Reply
from ._records import MultiResults, children2

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._pending import Sent
    from ._watches import Watches

__all__ = ["Replies"]

_NO_NODE = kz.NoNodeError.code
#: The answers in which None is a value: a node's data, and "no node" for exists.
_MAY_BE_NULL = (GetData, Exists)


class Replies:
    """The requests and auth packets awaiting an answer on one connection, and what
    each incoming frame settles.

    :param watches: the session's watch tables (armed by replies, fired by events)
    :param last_zxid: the last zxid the session saw
    :ivar in_flight: the requests sent, oldest first
    :ivar last_zxid: updated from every reply that carries one
    """

    __slots__ = ("_auth", "_watches", "in_flight", "last_zxid")

    def __init__(self, watches: Watches, last_zxid: int) -> None:
        self._watches = watches
        self.in_flight = InFlight()
        self._auth: deque[Reply] = deque()
        self.last_zxid = last_zxid

    def expect_auth(self) -> Reply:
        """An auth packet is being sent: its answer resolves the returned Reply."""
        reply = Reply()
        self._auth.append(reply)
        return reply

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """The connection ended: settle every request with ``error()``, every auth
        packet with ``ConnectionLoss``."""
        self.in_flight.fail_all(error)
        auth, self._auth = self._auth, deque()
        for reply in auth:
            reply.resolve(error=kz.ConnectionLoss())

    def dispatch(self, frame: bytes) -> None:
        """Act on one frame from the server. Not a checkpoint.

        :raises ProtocolError: the frame breaks the protocol (the connection must go)
        """
        xid, zxid, err = reply_header(frame)
        if xid >= 0:
            self._answer(self.in_flight.pop(xid), zxid, err, frame)
        elif xid == WATCH_XID:
            self._event(frame)
        elif xid == AUTH_XID:
            if not self._auth:
                raise ProtocolError("an auth answer to no auth packet")
            error = kz.AuthFailedError(f"authentication refused (code {err})") if err else None
            self._auth.popleft().resolve(True, error)
        elif xid not in (PING_XID, SET_WATCHES_XID):
            raise ProtocolError(f"a reply with xid {xid}")

    def _event(self, frame: bytes) -> None:
        try:
            watch, _ = Watch.deserialize(frame, REPLY_HEADER_SIZE)
        except DECODE_ERRORS as exc:
            raise ProtocolError("an undecodable watch event") from exc
        if not isinstance(watch.path, str) or not watch.path.startswith("/"):
            raise ProtocolError(f"a watch event for {watch.path!r}: not a path")
        self._watches.fire(watch.type, watch.path)

    def _answer(self, sent: Sent, zxid: int, err: int, frame: bytes) -> None:
        if zxid > 0:
            self.last_zxid = zxid
        request, arming = sent.request, sent.arming
        if err == 0:
            value = _decoded(request, frame)
            if type(value) is MultiResults:
                value.zxid = zxid
            if arming is not None:
                self._watches.arm(arming)
            sent.reply.resolve(value)
        elif err == _NO_NODE and request.type == Exists.type:
            if arming is not None:
                self._watches.arm(arming, exists=False)
            sent.reply.resolve(None)
        else:
            sent.reply.resolve(error=error_for(err))


def _decoded(request: Any, frame: bytes) -> Any:
    """The body of the answer to *request* (None for a record with no answer body).

    :raises ProtocolError: it does not decode, or holds a null string where a path or
        a name must be
    """
    if not hasattr(request, "deserialize"):
        return None
    try:
        if type(request) is GetChildren2:
            value = children2(frame, REPLY_HEADER_SIZE)
        else:
            value = request.deserialize(frame, REPLY_HEADER_SIZE)
    except DECODE_ERRORS as exc:
        raise ProtocolError(f"an undecodable answer to {type(request).__name__}") from exc
    if not isinstance(request, _MAY_BE_NULL) and _holds_null(value):
        raise ProtocolError(f"a null string in the answer to {type(request).__name__}")
    return value


def _holds_null(value: Any) -> bool:
    """Whether *value* (a decoded answer: strings, stats, lists and tuples of them) is
    or holds None. Bounded by the frame: every element was read from it. (``None in``
    and ``map`` run in C: a listing of 3,000 children checked item by item in Python
    cost a tenth of a busy queue's client CPU.)"""
    if value is None:
        return True
    if isinstance(value, list | tuple):
        if None in value:
            return True
        if set(map(type, value)) <= _FLAT:  # a listing of names: nothing nested
            return False
        return any(_holds_null(item) for item in value if isinstance(item, list | tuple))
    return False


_FLAT = {str, int, bytes, bool}
