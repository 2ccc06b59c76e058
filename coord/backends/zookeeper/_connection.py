"""One wire client (one ZooKeeper session) at a time, and requests on it.

* Each session is a :class:`~._wire.WireClient`, run by a task of the backend's task
  group (its own tasks live in that task, which ends when the client is closed). No
  thread: requests are awaited on the event loop.
* Every request has a time budget of one session timeout, retries included: a client cut
  off for that long has lost its session anyway. Reads and other repeatable requests are
  retried after a connection loss; the wire client holds a request made while it
  reconnects and sends it once connected, so a retry waits for the connection instead
  of spinning.
* A session that the server expired (LOST) while no lease stands for it is replaced by
  a new one at the next request, as a lazily opened session should be; a leased one is
  not (its lease is lost: the session stays over until a new grant).
* An outage is two lines of the log: a WARNING when the connection drops, an INFO when
  it is back, with the failed attempts counted (each is logged at DEBUG by the wire).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    CoordError,
    SessionExpiredError,
)
from .._common.probe import ZOOKEEPER, first_contact
from ._errors import ANSWERS, translate
from ._wire import State, WireClient

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Sequence

    from anyio.abc import TaskStatus

    from ..._core.background import BackgroundTasks
    from .._common.tls import TLSFiles

__all__ = ["Connection"]

log = logging.getLogger("coord.backends.zookeeper")


class Connection:
    """The wire client of one backend, replaced when a new session is needed.

    :param hosts: ``(host, port)`` pairs of the ensemble
    :param auth_data: ``(scheme, credential)`` pairs, sent on every (re)connect
    :param acl: the ACL of every node this connection creates
    :param connect_timeout: how long :meth:`open` waits for a first connection
    :param tls: the TLS files, or None for plain text
    :param on_state: called as ``on_state(client, state)`` for every state change of a
        client (CONNECTED / SUSPENDED / LOST / CLOSED), from the client's task
    :param url: the store's URL without secrets, for the log
    """

    def __init__(
        self,
        *,
        hosts: Sequence[tuple[str, int]],
        auth_data: Sequence[tuple[str, str]],
        acl: Sequence[Any],
        connect_timeout: float,
        on_state: Callable[[WireClient, State], None],
        url: str = "zk://",
        tls: TLSFiles | None = None,
    ) -> None:
        if not hosts:
            raise ValueError("no ZooKeeper host given")
        self.hosts = list(hosts)
        self._auth_data = list(auth_data)
        self.acl = list(acl)
        self._connect_timeout = connect_timeout
        self._on_state = on_state
        self._url = url
        self._tls = tls
        self._ssl_context: ssl.SSLContext | None = None  # made at the first contact
        self._lock = anyio.Lock()
        self._running: dict[WireClient, anyio.Event] = {}  # client -> set to end its task
        self._down_since: float | None = None
        #: Runs the clients' tasks: the backend's task group, set once it is open.
        self.task_group: BackgroundTasks | None = None
        self.client: WireClient | None = None
        self.session_id = 0
        self.password = b""
        self.timeout = 10.0
        self._contacted = False  # a first contact was made, and no client started since
        #: A lease stands for the current session (a lost one is then not replaced).
        self.leased = False
        #: The session was ended on purpose (its lease was lost or revoked).
        self.ended = False
        self.closed = False

    # -- lifecycle ------------------------------------------------------------------------

    async def current(self, default_timeout: float) -> WireClient:
        """The wire client; a session is opened with *default_timeout* if there is none
        (or if the current one was lost while no lease stood for it).

        :raises ClosedError: if the connection is closed
        :raises SessionExpiredError: if the session was ended and no new one granted
        """
        client = self.client
        if client is not None and not self.closed and client.state is not State.LOST:
            return client
        async with self._lock:
            if self.closed:
                raise ClosedError("the ZooKeeper backend is closed")
            client = self.client
            if client is not None and client.state is State.LOST and not self.leased:
                self.client = None
                await self._stop(client)
            if self.client is None:
                if self.ended:
                    raise SessionExpiredError("the ZooKeeper session is over (lost or revoked)")
                await self._start(default_timeout)
            assert self.client is not None
            return self.client

    async def ready(self, default_timeout: float) -> WireClient:
        """The wire client, once connected: its ``*_nowait`` requests go out at once if
        made before the next checkpoint. A checkpoint if it waits (bound it).

        :raises SessionExpiredError: the session is over
        """
        client = await self.current(default_timeout)
        try:
            await client.wait_connected()
        except Exception as exc:
            raise self.translate(exc, "connect", client) from exc
        return client

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

        Over TLS, the first contact verifies the server's certificate as the sessions'
        connections do: a wrong CA is named at once, not after connect_timeout of
        refused attempts.

        :raises BackendUnavailable: if no member does
        :raises ConfigurationError: if the TLS files are not a certificate and its key
        """
        if self._tls is not None and self._ssl_context is None:
            self._ssl_context = await self._tls.client_context()
        await first_contact(
            "ZooKeeper",
            ZOOKEEPER,
            self.hosts,
            connect_timeout=self._connect_timeout,
            tls=self._ssl_context,
        )
        self._contacted = True

    @property
    def negotiated(self) -> float:
        """The session timeout the server granted at the last handshake (seconds)."""
        return self.client.negotiated_timeout if self.client is not None else self.timeout

    async def _start(self, session_timeout: float) -> None:
        # Every session start follows a first contact: a refused, hung or foreign server
        # fails fast there, rather than after connect_timeout of attempts.
        if not self._contacted:
            await self.first_contact()
        self._contacted = False
        client = WireClient(
            self.hosts,
            session_timeout=session_timeout,
            connect_timeout=self._connect_timeout,
            auth=self._auth_data,
            ssl_context=self._ssl_context,
        )
        client.add_listener(lambda state: self._client_state(client, state))
        assert self.task_group is not None
        # Shielded, bounded by connect_timeout: a start abandoned halfway would leave a
        # session open on the server for nobody.
        with anyio.CancelScope(shield=True):
            try:
                await self.task_group.start(self._run, client)
            except kz.ConnectionLoss as exc:
                raise BackendUnavailable(
                    f"cannot connect to ZooKeeper: {self._url} answered, but no session "
                    f"was opened within {self._connect_timeout:g}s"
                ) from exc
            except Exception as exc:  # credentials refused, ...
                raise translate(exc, "connect", closed=False, ended=False) from exc
        self.client, self.timeout, self.ended, self.leased = client, session_timeout, False, False
        self.session_id, self.password = client.session_id, client.password
        log.debug("ZooKeeper session %#x (timeout %gs)", self.session_id, session_timeout)

    async def _run(self, client: WireClient, *, task_status: TaskStatus[None]) -> None:
        # Shielded: the client (and its tasks) must outlive a cancellation of the
        # backend's task group, to send its CloseSession when it is stopped (aclose()
        # ends the block). The backend stops every client before leaving its group.
        stop = self._running[client] = anyio.Event()
        try:
            with anyio.CancelScope(shield=True):
                async with client:
                    task_status.started()
                    await stop.wait()
        finally:
            del self._running[client]

    def _client_state(self, client: WireClient, state: State) -> None:
        # From the client's task: log an outage of the current client, pass the news on.
        if client is self.client and not self.closed:
            if state is State.SUSPENDED and self._down_since is None:
                self._down_since = anyio.current_time()
                why = client.last_error
                log.warning(
                    "connection to ZooKeeper %s lost (%s); retrying",
                    self._url,
                    (str(why) or type(why).__name__) if why is not None else "closed",
                )
            elif state is State.LOST:
                self._down_since = None  # (the session's loss is logged as such)
            elif state is State.CONNECTED and self._down_since is not None:
                log.info(
                    "connection to ZooKeeper %s is back after %.1fs (%d failed attempts)",
                    self._url,
                    anyio.current_time() - self._down_since,
                    client.dial_failures,
                )
                self._down_since = None
        self._on_state(client, state)

    async def end(self, session_id: int | None = None) -> None:
        """End the session (only if it is *session_id*, when given: a later session must
        never be ended by news about an earlier one): the client closes it on the server,
        so its ephemeral nodes go now.

        If the connection is down, the client is given up to one session timeout to
        reconnect first (a session that outlived a short outage would otherwise keep the
        nodes of a lease nobody holds until the server times it out). Nothing is sent
        for the session meanwhile: its requests already fail. Shielded.
        """
        if session_id is not None and session_id != self.session_id:
            return
        self.ended = True
        client, self.client = self.client, None
        if client is None:
            return
        with anyio.CancelScope(shield=True):
            if client.state is State.SUSPENDED:
                with anyio.move_on_after(self.timeout):
                    try:
                        await client.wait_connected()
                    except kz.KazooException:
                        pass  # lost or closed meanwhile: nothing left to close
            await self._stop(client)

    async def close(self) -> None:
        """Close for good (ends the session). Shielded."""
        self.closed = True
        with anyio.CancelScope(shield=True):
            for client in list(self._running):
                await self._stop(client)  # (an end() waiting for a reconnection goes on)
            async with self._lock:  # (a start under way ends first: stop its client too)
                self.client = None
                for client in list(self._running):
                    await self._stop(client)

    async def _stop(self, client: WireClient) -> None:
        """Close *client* (CloseSession, bounded in time) and end its task. Shielded."""
        await client.aclose()
        stop = self._running.get(client)
        if stop is not None:
            stop.set()

    # -- requests -------------------------------------------------------------------------

    def translate(self, exc: BaseException, what: str, client: WireClient | None) -> CoordError:
        """The coord error for *exc*, raised by a request on *client*."""
        error = translate(exc, what, closed=self.closed, ended=self.ended)
        if isinstance(exc, kz.ConnectionClosedError) and client is self.client:
            # The current client is closed but nobody closed it on purpose.
            error = BackendError(f"ZooKeeper {what}: the client stopped ({exc})")
        elif isinstance(exc, kz.SessionExpiredError) and not (
            self.ended or (client is self.client and self.leased)
        ):
            # A session no lease stands for, lost or replaced: the retry gets a new one.
            error = BackendUnavailable(f"ZooKeeper {what}: the session was replaced")
        return error

    async def call(
        self, what: str, request: Callable[[WireClient], Awaitable[Any]], *, retry: bool = False
    ) -> Any:
        """:meth:`call_counting`, without the count."""
        return (await self.call_counting(what, request, retry=retry))[0]

    async def call_counting(
        self, what: str, request: Callable[[WireClient], Awaitable[Any]], *, retry: bool = False
    ) -> tuple[Any, int]:
        """Await ``request(client)`` (a wire client request) and return its result.

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
                    return await request(client), attempt
                except ANSWERS as exc:
                    exc.attempts = attempt  # type: ignore[attr-defined]
                    raise
                except Exception as exc:
                    error = self.translate(exc, what, client)
                    if not (retry and isinstance(error, BackendUnavailable)):
                        raise error from exc
        raise BackendUnavailable(f"ZooKeeper {what}: no answer within {budget:g}s")
