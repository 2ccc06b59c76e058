"""A ZooKeeper session across connections: its state machine and its supervisor task.

::

    CONNECTING --> CONNECTED <--> SUSPENDED      (a drop, then a resume)
                       |              |
                       +--> LOST <----+          (expired: for good)
                       +--> CLOSED               (aclose)

* The supervisor opens a connection to a host of the list (:mod:`._dial`: a
  ConnectRequest with the session's id and password once it has one, hosts in turn,
  backing off up to a second). An attempt is bounded by a third of the session
  timeout. A read-only server is a failed attempt unless ``read_only`` is set, and so
  is a new session granted a timeout under :data:`MIN_TIMEOUT_MS`. A connection that
  ended within that third is followed by the same backoff: a server that opens
  sessions and breaks them at once is not reconnected to in a tight loop.
* On a connection: auth packets first (their answers awaited: a refusal ends the
  session), then the session's watches re-armed with SetWatches relative to the last
  zxid seen, then CONNECTED: requests waiting for a connection go out.
* A drop makes the session SUSPENDED: requests in flight fail with ConnectionLoss,
  new ones wait. The session is LOST when the server says it expired, and also when no
  server was heard for a whole negotiated timeout (the server has expired it by then;
  Curator decides the same way): every watch fires with an event of type NONE, every
  waiter fails with SessionExpiredError.
* State changes are passed to listeners, on the event loop, from the supervisor task.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from kazoo import exceptions as kz
from kazoo.protocol.serialization import Connect
from kazoo.protocol.states import KeeperState

from ._connection import Connection
from ._dial import Dialer
from ._errors import ProtocolError
from ._records import set_watches_batches

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

    from anyio.abc import TaskStatus

    from ._dial import Opened
    from ._watches import Watches

__all__ = ["Session", "State", "StateListener"]

log = logging.getLogger("coord.backends.zookeeper")

#: The shortest session timeout taken from a server (ms). Pings go out every third of
#: it: a server granting a millisecond would have the client ping in a busy loop.
#: ZooKeeper's own floor is two ticks (``minSessionTimeout``), tens of ms at the least.
MIN_TIMEOUT_MS = 10


class State(enum.StrEnum):
    """A session's state (the first three spelled as kazoo's ``KazooState``)."""

    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"
    CLOSED = "CLOSED"


class StateListener(Protocol):
    """Called on the event loop with the new state; must not block."""

    def __call__(self, state: State, /) -> object: ...


class Session:
    """The state of one session and the task that keeps it connected.

    :param hosts: ``(host, port)`` pairs, tried in turn
    :param session_timeout: the timeout asked for (seconds); the server may clamp it
    :param connect_timeout: how long :meth:`run` may take to open the session
    :param resume: ``(session_id, password)`` of a session to take over
    :param ssl_context: connect over TLS with it
    """

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        *,
        watches: Watches,
        session_timeout: float,
        connect_timeout: float,
        auth: Sequence[tuple[str, str]] = (),
        read_only: bool = False,
        resume: tuple[int, bytes] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._dialer = Dialer(hosts, ssl_context=ssl_context)
        self.watches = watches
        self.requested_timeout = session_timeout
        self.negotiated_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self._auth = list(auth)
        self._read_only = read_only
        self.session_id, self.password = resume or (0, b"\x00" * 16)
        self._last_zxid = 0
        self.state = State.CONNECTING
        self._conn: Connection | None = None  # while CONNECTED
        self._changed = anyio.Event()  # set (and replaced) at every state change
        self._listeners: list[StateListener] = []
        self._ended: Callable[[], BaseException] | None = None
        #: Set by the client before it closes the session: a drop is then no news.
        self.closing = False
        self._heard = anyio.current_time()
        #: Reconnection is held off while this is above 0 (fault injection: see
        #: :meth:`hold`); the session's deadline still runs.
        self.held = 0
        #: Why the last connection ended (None until one did).
        self.last_error: BaseException | None = None
        self._started: TaskStatus[None] | None = None
        #: The last connection ended soon after it opened: the next dial pauses first.
        self._brief = False

    @property
    def last_zxid(self) -> int:
        conn = self._conn
        return conn.last_zxid if conn is not None else self._last_zxid

    @property
    def current(self) -> Connection | None:
        """The open connection, if the session is CONNECTED."""
        conn = self._conn
        return conn if conn is not None and conn.open else None

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self._listeners.remove(listener)

    def connection_nowait(self) -> Connection:
        """The open connection. Not a checkpoint.

        :raises kazoo.exceptions.ConnectionLoss: the session is not connected now
        :raises kazoo.exceptions.SessionExpiredError: the session is lost
        :raises kazoo.exceptions.ConnectionClosedError: the client is closed
        """
        conn = self.current
        if conn is not None:
            return conn
        if self._ended is not None:
            raise self._ended()
        raise kz.ConnectionLoss("not connected to ZooKeeper (the session is suspended)")

    @property
    def dial_failures(self) -> int:
        """Connection attempts that failed before the current connection (or since the
        last one)."""
        return self._dialer.failures

    async def connection(self) -> Connection:
        """The open connection, once there is one. A checkpoint if it waits.

        :raises kazoo.exceptions.SessionExpiredError: the session is lost
        :raises kazoo.exceptions.ConnectionClosedError: the client is closed
        """
        while True:
            conn = self.current
            if conn is not None:
                return conn
            if self._ended is not None:
                raise self._ended()
            await self._changed.wait()

    def hold(self) -> None:
        """Hold off reconnecting (until :meth:`release`). Not a checkpoint."""
        self.held += 1

    def release(self) -> None:
        self.held -= 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # -- transitions -----------------------------------------------------------------------

    def _set_state(self, state: State) -> None:
        if state == self.state:
            return
        self.state = state
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("a ZooKeeper state listener failed (%s)", state)

    def end(self, state: State, error: Callable[[], BaseException], keeper_state: str) -> None:
        """End the session for good (LOST or CLOSED): fire every watch, fail every
        waiter with ``error()``, drop the connection. Not a checkpoint."""
        if self._ended is not None:
            return
        self._ended = error
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail_with = error
            conn.drop(error())
            self._last_zxid = conn.last_zxid
        self._set_state(state)
        self.watches.fire_all(keeper_state)

    def _lose(self, why: str, error: type[BaseException] = kz.SessionExpiredError) -> None:
        log.warning("ZooKeeper session %#x lost: %s", self.session_id, why)
        self.end(State.LOST, lambda: error(f"the ZooKeeper session is lost: {why}"), _KEEPER[error])

    # -- the supervisor ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open the session (within ``connect_timeout``), report it started, then keep it
        connected until it ends.

        :raises kazoo.exceptions.ConnectionLoss: no server opened it in time
        :raises kazoo.exceptions.AuthFailedError: the server refused the credentials
        """
        self._started = task_status
        try:
            await self._keep(anyio.current_time() + self.connect_timeout)
        except kz.SessionExpiredError as exc:
            self._lose(str(exc) or "expired")
        except Exception:
            if self._started is not None:
                raise  # the session never opened: the opener hears why
            log.exception("the ZooKeeper session supervisor failed")
            self._lose("the client failed (see the log)")
        if self._started is not None and self._ended is not None:
            raise self._ended()

    async def _keep(self, first_deadline: float) -> None:
        while self._ended is None and not self.closing:
            opening = self._started is not None
            opened = None
            deadline = first_deadline if opening else self._heard + self.negotiated_timeout
            with anyio.CancelScope(deadline=deadline):
                while self.held:
                    await self._changed.wait()
                opened = await self._dialer.dial(
                    self._connect_request(),
                    attempt=self._attempt_timeout(),
                    accept=self._accept,
                    pause=self._brief,
                )
            if opened is None and opening:
                failure = self._dialer.failure
                raise kz.ConnectionLoss(
                    f"no ZooKeeper server of {self._dialer} opened a session within "
                    f"{self.connect_timeout:g}s (last failure: {failure!r})"
                ) from failure
            if opened is None:
                timeout = self.negotiated_timeout
                self._lose(f"no server answered for the whole {timeout:g}s session timeout")
                return
            await self._serve(opened)

    def _connect_request(self) -> Any:
        timeout_ms = int(self.requested_timeout * 1000)
        zxid, session, password = self.last_zxid, self.session_id, self.password
        return Connect(0, zxid, timeout_ms, session, password, self._read_only)

    def _attempt_timeout(self) -> float:
        return max(self.negotiated_timeout / 3, 0.1)

    def _accept(self, reply: Any) -> bool:
        """Take the ConnectResponse *reply*: False for a read-only server we refuse.

        :raises kazoo.exceptions.SessionExpiredError: the server says the session we
            resume expired (a timeout of 0 or less, or another session)
        :raises ProtocolError: a new session granted no timeout, or one too short to
            keep (the attempt fails; the next host is tried)
        """
        resumed = self.session_id != 0
        if resumed and (reply.time_out <= 0 or reply.session_id != self.session_id):
            raise kz.SessionExpiredError("the server says the session expired")
        if reply.time_out < MIN_TIMEOUT_MS:
            raise ProtocolError(f"a session timeout of {reply.time_out} ms was granted")
        if reply.read_only and not self._read_only:
            return False
        self.session_id, self.password = reply.session_id, reply.passwd
        self.negotiated_timeout = reply.time_out / 1000
        return True

    async def _serve(self, opened: Opened) -> None:
        """Authenticate, re-arm the watches and serve requests on *opened* until it
        drops; leave the session SUSPENDED (or ended)."""
        conn = Connection(
            opened, watches=self.watches, timeout=self.negotiated_timeout, last_zxid=self.last_zxid
        )
        opened_at = anyio.current_time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.run)
            if await self._prepare(conn):
                self._conn = conn
                self._set_state(State.CONNECTED)
                if self._started is not None:
                    self._started.started()
                    self._started = None
        self._heard, self._last_zxid = conn.last_heard, conn.last_zxid
        self.last_error = conn.error
        self._brief = anyio.current_time() - opened_at < self._attempt_timeout()
        if self._conn is conn:
            self._conn = None
        if self._ended is None and not self.closing and self.state is State.CONNECTED:
            self._set_state(State.SUSPENDED)

    async def _prepare(self, conn: Connection) -> bool:
        """Auth and SetWatches on a new connection; False if it failed (dropped)."""
        try:
            with anyio.fail_after(self._attempt_timeout()):
                for reply in [conn.authenticate(scheme, cred) for scheme, cred in self._auth]:
                    await reply.wait()
        except kz.AuthFailedError as exc:
            self._lose(str(exc), kz.AuthFailedError)
            conn.drop(exc)
            return False
        except (TimeoutError, kz.ConnectionLoss) as exc:
            self._dialer.failure = exc
            conn.drop(exc)
            return False
        for request in set_watches_batches(conn.last_zxid, *self.watches.paths()):
            conn.set_watches(request)
        return True


_KEEPER = {
    kz.SessionExpiredError: KeeperState.EXPIRED_SESSION,
    kz.AuthFailedError: KeeperState.AUTH_FAILED,
}
