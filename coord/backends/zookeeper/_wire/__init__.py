"""ZooKeeper's client protocol on anyio: one session, no thread.

kazoo's codec (``kazoo.protocol.serialization``) encodes and decodes the records; this
package owns what kazoo's connection thread did: framing and xid order
(:mod:`._framing`, :mod:`._pending`), a connection's reader, writer and pings
(:mod:`._connection`), the session across connections with its reconnection, expiry
and watch re-registration (:mod:`._session`, :mod:`._watches`), and the request API
(:mod:`._client`).

The ZooKeeper backend runs on it: one :class:`WireClient` per session
(:mod:`.._connection`).
"""

from __future__ import annotations

from ._client import WireClient
from ._errors import MultiFailed, ProtocolError
from ._ops import check_op, create_op, delete_op, set_data_op
from ._pending import Reply
from ._records import MultiResults
from ._session import State, StateListener
from ._watches import WatchCallback, Watcher

__all__ = [
    "MultiFailed",
    "MultiResults",
    "ProtocolError",
    "Reply",
    "State",
    "StateListener",
    "WatchCallback",
    "Watcher",
    "WireClient",
    "check_op",
    "create_op",
    "delete_op",
    "set_data_op",
]
