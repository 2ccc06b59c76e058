"""Every use of kazoo's private API, in one place.

kazoo's public API lacks three things coord needs; each is reached through an internal
that has been stable for years. pyproject.toml pins the kazoo versions these were
checked against, and ``tests/integration/zookeeper/test_kazoo_internals.py`` tests each
one against the installed kazoo and a real server, so that an upgrade that breaks one
fails loudly instead of silently:

* the **negotiated session timeout** (the server clamps the one asked for to its
  ``min/maxSessionTimeout``): read from the Connect reply, by wrapping the connection
  handler's ``_invoke`` (it runs on kazoo's connection thread, before the CONNECTED
  state is reported);
* **requests kazoo has no method for** (createContainer, opcode 19): queued with
  ``KazooClient._call``, as kazoo's own methods do;
* **dropping the connection** for fault injection: kazoo's test marker
  ``_CONNECTION_DROP`` queued the same way.

Nothing here touches kazoo's watcher tables: kazoo mutates them only on its connection
thread, and a ``get`` answered "no node" registers no watcher there (checked by the
same test), so coord never needs to.
"""

from __future__ import annotations

from typing import Any

from kazoo.protocol.connection import _CONNECTION_DROP
from kazoo.protocol.serialization import Connect

__all__ = ["CONNECTION_DROP", "queue_request", "watch_negotiated_timeout"]

#: kazoo's own test marker: queued as a request, it makes kazoo drop the TCP connection
#: as if the network had failed (then it reconnects, to the same session if it can).
CONNECTION_DROP: Any = _CONNECTION_DROP


def watch_negotiated_timeout(client: Any) -> list[float]:
    """Record, at every handshake of *client*, the session timeout the server granted.

    Returns a one-element list updated in place (seconds; empty until the first
    handshake). Call before ``client.start()``.
    """
    box: list[float] = []
    handler = client._connection
    invoke = handler._invoke

    def _invoke(timeout: float, request: Any, xid: Any = None) -> Any:
        result = invoke(timeout, request, xid)
        if isinstance(request, Connect) and isinstance(result, tuple):
            reply = result[0]
            if isinstance(reply, Connect) and reply.time_out > 0:
                box[:] = [reply.time_out / 1000.0]
        return result

    handler._invoke = _invoke
    return box


def queue_request(client: Any, request: Any, result: Any) -> None:
    """Queue a request object (a kazoo ``serialization`` record) like kazoo's methods do;
    its outcome is set on *result* (an ``IAsyncResult``). Call it on a thread that may
    call kazoo (coord's submitter thread)."""
    client._call(request, result)
