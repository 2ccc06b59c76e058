"""One kazoo client (one ZooKeeper session) at a time, and requests on it.

* The client is started and stopped in a worker thread (both block); requests go through
  the :class:`~._bridge.Bridge` and never block the event loop.
* Every request has a time budget of one session timeout, retries included: a client cut
  off for that long has lost its session anyway. Reads and other repeatable requests are
  retried after a connection loss; kazoo holds a request made while it reconnects and
  sends it once connected, so a retry waits for the connection instead of spinning.
* kazoo waits for a connection handshake for ``session timeout / number of hosts``:
  against one server, the whole session timeout, so a single handshake that is never
  answered costs the session (ZooKeeper 3.8.0 leaves a connection accepted while it
  starts up hanging: its close fails on a null database). Short host lists are given to
  kazoo with each host repeated, so that an attempt takes at most a third of the session
  timeout, as with a three-member ensemble.
"""

from __future__ import annotations

import itertools
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from ..._exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    CoordError,
    SessionExpiredError,
)
from .._probe import ZOOKEEPER, first_contact
from ._errors import ANSWERS, translate
from ._kazoo import watch_negotiated_timeout
from ._kazoo_log import KazooLog, Outages

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._bridge import Bridge, Reply

__all__ = ["Connection"]

log = logging.getLogger("coord.backends.zookeeper")


class Connection:
    """The kazoo client of one backend, replaced when a new session is needed.

    :param hosts: kazoo's host string, ``"h1:2181,h2:2181"`` (for fault injection)
    :param connect_hosts: the host string kazoo connects with (hosts repeated)
    :param auth_data: kazoo's ``(scheme, credential)`` pairs, sent on every (re)connect
    :param acl: the ACL of every node this connection creates
    :param connect_timeout: how long :meth:`open` waits for a first connection
    :param on_state: called on the event loop as ``on_state(client, state, session_id)``
        for kazoo's CONNECTED / SUSPENDED / LOST transitions
    :param url: the store's URL without secrets, for the log (kazoo's connection chatter
        is folded into coord's lines: see :mod:`._kazoo_log`)
    """

    def __init__(
        self,
        bridge: Bridge,
        *,
        hosts: str,
        connect_hosts: str,
        auth_data: Sequence[tuple[str, str]],
        acl: Sequence[Any],
        connect_timeout: float,
        on_state: Callable[[Any, str, int], None],
        url: str = "zk://",
    ) -> None:
        self._bridge = bridge
        self.outages = Outages(url)
        self.hosts = hosts
        self._connect_hosts = connect_hosts
        self._auth_data = list(auth_data)
        self.acl = list(acl)
        self._connect_timeout = connect_timeout
        self._on_state = on_state
        self._reconnected: dict[int, anyio.Event] = {}  # id(client) -> event, in end()
        self._lock = anyio.Lock()
        self.client: Any = None
        self.session_id = 0
        self.password = b""
        self.timeout = 10.0
        self._negotiated: list[float] = []
        self._contacted = False  # a first contact was made, and no client started since
        #: The session was ended on purpose (its lease was lost or revoked).
        self.ended = False
        self.closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def current(self, default_timeout: float) -> Any:
        """The kazoo client; a session is opened with *default_timeout* if there is none.

        :raises ClosedError: if the connection is closed
        :raises SessionExpiredError: if the session was ended and no new one granted
        """
        client = self.client
        if client is not None and not self.closed:
            return client
        async with self._lock:
            if self.closed:
                raise ClosedError("the ZooKeeper backend is closed")
            if self.client is None:
                if self.ended:
                    raise SessionExpiredError("the ZooKeeper session is over (lost or revoked)")
                await self._start(default_timeout)
            return self.client

    async def open(self, session_timeout: float) -> None:
        """Replace the client (if any) with one on a new session of *session_timeout*
        seconds. A checkpoint; shielded once connecting (bounded by connect_timeout)."""
        async with self._lock:
            if self.closed:
                raise ClosedError("the ZooKeeper backend is closed")
            old, self.client = self.client, None
            if old is not None:
                await self._stop(old)
            await self._start(session_timeout)

    async def first_contact(self) -> None:
        """Check, within connect_timeout, that a member answers in ZooKeeper's protocol
        (:mod:`.._probe`); the next session start relies on it instead of asking again.
        A checkpoint.

        :raises BackendUnavailable: if no member does
        """
        await first_contact(
            "ZooKeeper", ZOOKEEPER, self._endpoints(), connect_timeout=self._connect_timeout
        )
        self._contacted = True

    @property
    def negotiated(self) -> float:
        """The session timeout the server granted at the last handshake (seconds)."""
        return self._negotiated[0] if self._negotiated else self.timeout

    def _endpoints(self) -> list[tuple[str, int]]:
        hosts = []
        for item in self.hosts.split(","):
            host, _, port = item.rpartition(":")
            hosts.append((host.strip("[]"), int(port)))
        return hosts

    async def _start(self, session_timeout: float) -> None:
        # Every start of a kazoo client follows a first contact: kazoo would take a
        # refused, hung or foreign server for a slow one, retrying in a loop.
        if not self._contacted:
            await self.first_contact()
        self._contacted = False
        # Shielded and bounded by connect_timeout: a client started in a thread whose
        # result we stopped waiting for would keep its threads and session forever.
        with anyio.CancelScope(shield=True):
            try:
                client = await anyio.to_thread.run_sync(self._start_client, session_timeout)
            except KazooTimeoutError as exc:
                raise BackendUnavailable(
                    f"cannot connect to ZooKeeper: {self.hosts} answered, but no session was "
                    f"opened within {self._connect_timeout:g}s"
                ) from exc
            except Exception as exc:  # kazoo refuses its arguments, ...
                raise translate(exc, "connect", closed=False, ended=False) from exc
        client, client_id, negotiated = client
        self.client, self.timeout, self.ended = client, session_timeout, False
        self.session_id, self.password = client_id
        self._negotiated = negotiated
        log.debug("coord: ZooKeeper session %#x (timeout %gs)", self.session_id, session_timeout)

    def _start_client(self, timeout: float) -> tuple[Any, tuple[int, bytes], list[float]]:
        # Blocks: runs in a worker thread.
        client = KazooClient(
            hosts=self._connect_hosts,
            timeout=timeout,
            auth_data=self._auth_data or None,
            default_acl=self.acl,
            logger=KazooLog(self.outages),
            # Reconnect at least every second: kazoo's default backoff grows to an hour.
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_jitter=0.5, max_delay=1.0),
        )

        def listener(state: str) -> None:  # on kazoo's connection thread: must not block
            client_id = client.client_id
            session_id = client_id[0] if client_id else 0
            self._bridge.to_loop(self._client_state, client, state, session_id)

        client.add_listener(listener)
        negotiated = watch_negotiated_timeout(client)
        client.start(timeout=self._connect_timeout)
        client_id = client.client_id  # None if the connection dropped already
        if client_id is None:
            client.stop()
            client.close()
            raise kz.ConnectionLoss()
        return client, client_id, negotiated

    def _client_state(self, client: Any, state: str, session_id: int) -> None:
        # A loop callback (outside any task): wake end(), then pass the news on.
        if state == KazooState.CONNECTED and id(client) in self._reconnected:
            self._reconnected[id(client)].set()
        self._on_state(client, state, session_id)

    async def end(self, session_id: int | None = None) -> None:
        """End the session (only if it is *session_id*, when given: a later session must
        never be ended by news about an earlier one): kazoo closes it on the server, so
        its ephemeral nodes go now.

        If the connection is down, kazoo is given up to one session timeout to reconnect
        first (a session that outlived a short outage would otherwise keep the nodes of
        a lease nobody holds until the server times it out). Nothing is sent for the
        session meanwhile: its requests already fail. Shielded.
        """
        if session_id is not None and session_id != self.session_id:
            return
        self.ended = True
        client, self.client = self.client, None
        if client is None:
            return
        with anyio.CancelScope(shield=True):
            if client.state != KazooState.CONNECTED:
                reconnected = self._reconnected[id(client)] = anyio.Event()
                with anyio.move_on_after(self.timeout):
                    await reconnected.wait()
                del self._reconnected[id(client)]
            await self._stop(client)

    async def close(self) -> None:
        """Close for good (ends the session). Shielded."""
        self.closed = True
        for reconnected in self._reconnected.values():
            reconnected.set()  # an end() waiting for a reconnection stops its client now
        async with self._lock:
            client, self.client = self.client, None
            if client is not None:
                await self._stop(client)

    @staticmethod
    async def _stop(client: Any) -> None:
        def stop() -> None:
            if isinstance(client.logger, KazooLog):
                client.logger.stopping()
            try:
                client.stop()
                client.close()
            except Exception:  # kazoo's writer did not stop: nothing more to do here
                log.exception("coord: stopping a kazoo client failed")

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stop)

    # -- requests -------------------------------------------------------------------------

    @property
    def bridge(self) -> Bridge:
        """The bridge to kazoo's threads (for requests whose outcome is a callback)."""
        return self._bridge

    def start(self, request: Callable[[], Any]) -> Reply:
        """Issue one kazoo ``*_async`` call without waiting (no retry, no budget)."""
        return self._bridge.start(request)

    def translate(self, exc: BaseException, what: str, client: Any) -> CoordError:
        """The coord error for *exc*, raised by a request on *client*."""
        error = translate(exc, what, closed=self.closed, ended=self.ended)
        if isinstance(exc, kz.ConnectionClosedError) and client is self.client:
            # The current client is stopped but nobody stopped it on purpose: kazoo gave
            # up reconnecting (authentication failed).
            error = BackendError(f"ZooKeeper {what}: the client stopped ({exc})")
        return error

    async def call(self, what: str, request: Callable[[Any], Any], *, retry: bool = False) -> Any:
        """:meth:`call_counting`, without the count."""
        return (await self.call_counting(what, request, retry=retry))[0]

    async def call_counting(
        self, what: str, request: Callable[[Any], Any], *, retry: bool = False
    ) -> tuple[Any, int]:
        """Run ``request(client)`` (a kazoo ``*_async`` call) and return its result.

        A checkpoint. Answers about the data (NoNodeError, NodeExistsError,
        BadVersionError, NotEmptyError) are raised as kazoo's exceptions; every other
        error is translated.

        :param retry: repeat the request after a connection loss (only for requests that
            are safe to repeat)
        :returns: the result, and how many attempts it took (an answer after more than
            one may be about the effect of an earlier attempt whose reply was lost; an
            answer raised as an exception carries the count as ``attempts``)
        :raises BackendUnavailable: no answer within the session timeout
        """
        budget = self.timeout
        with anyio.move_on_after(budget):
            for attempt in itertools.count(1):
                client = await self.current(budget)
                try:
                    return await self._bridge.start(partial(request, client)).result(), attempt
                except ANSWERS as exc:
                    exc.attempts = attempt  # type: ignore[attr-defined]
                    raise
                except Exception as exc:
                    error = self.translate(exc, what, client)
                    if not (retry and isinstance(error, BackendUnavailable)):
                        raise error from exc
        raise BackendUnavailable(f"ZooKeeper {what}: no answer within {budget:g}s")
