"""kazoo's own log, folded into coord's lines.

kazoo logs every failed connection attempt as a WARNING ("Connection dropped: ...",
"Connection time-out: ...") and every attempt as an INFO ("Connecting to ..."): it
retries about every second on each host, so a 5 s outage prints some 80 lines. Each
kazoo client of a backend is given a :class:`KazooLog` as its logger (kazoo's
``KazooClient(logger=...)``, which its connection thread uses too). It turns an outage
into two lines of coord's (logger ``coord.backends.zookeeper``):

* one WARNING when the first attempt fails ("connection to ZooKeeper lost; retrying"),
* one INFO when a connection is established again, with the outage's length and how
  many attempts failed meanwhile;

and passes kazoo's connection chatter on to kazoo's own logger (``kazoo.client``) at
DEBUG, for whoever wants it. Everything else from kazoo (authentication failures,
exceptions) keeps its level.

Runs on kazoo's connection thread: it never blocks beyond a logging call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["KazooLog", "Outages"]

log = logging.getLogger("coord.backends.zookeeper")

# kazoo's format strings (kazoo/protocol/connection.py and client.py, 2.10 and 2.11).
_FAILED = frozenset({"Connection dropped: %s", "Connection time-out: %s"})
_CONNECTED = "Zookeeper connection established, state: %s"
#: Connection chatter, logged by kazoo at every attempt or state change: DEBUG here.
_CHATTER = _FAILED | {
    _CONNECTED,
    "Connecting to %s(%s):%s, use_ssl: %r",
    "Transition to CONNECTING",
    "Zookeeper connection lost",
    "Closing connection to %s:%s",
    "Zookeeper session closed, state: %s",
    "Session has expired",  # coord says it: the session's loss, with its reason
}


class Outages:
    """The outages of one backend's connection, across its kazoo clients (a session
    replaced during an outage does not start a second one).

    :param url: the store's URL, without secrets (for coord's lines)
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._failures = 0

    @property
    def failures(self) -> int:
        """Connection attempts that failed in the current outage (0 when connected)."""
        return self._failures

    def failed(self, error: str) -> None:
        with self._lock:
            self._failures += 1
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            log.warning("coord: connection to ZooKeeper %s lost (%s); retrying", self._url, error)

    def connected(self) -> None:
        with self._lock:
            since, failures = self._down_since, self._failures
            self._down_since, self._failures = None, 0
        if since is not None:
            log.info(
                "coord: connection to ZooKeeper %s is back after %.1fs (%d failed attempts)",
                self._url,
                time.monotonic() - since,
                failures,
            )


class KazooLog(logging.LoggerAdapter[logging.Logger]):
    """The logger of one kazoo client (see the module docstring): kazoo's chatter to
    DEBUG, its connection failures and successes to *outages*."""

    def __init__(self, outages: Outages) -> None:
        super().__init__(logging.getLogger("kazoo.client"), {})
        self._outages = outages
        self._stopping = False

    def stopping(self) -> None:
        """The client is being stopped on purpose: its connection errors are no outage."""
        self._stopping = True

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg in _FAILED and not self._stopping:
            self._outages.failed(str(args[0]) if args else str(msg))  # kazoo's exception
        elif msg == _CONNECTED:
            self._outages.connected()
        if msg in _CHATTER:
            level = min(level, logging.DEBUG)
        if self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *map(_redacted, args), **kwargs)


def _redacted(arg: object) -> object:
    """kazoo's DEBUG line for each request it sends shows the request: an ``Auth`` packet
    carries the digest password in clear."""
    if type(arg).__name__ == "Auth" and hasattr(arg, "auth"):
        return f"Auth(scheme={getattr(arg, 'scheme', '?')!r}, auth='***')"
    return arg
