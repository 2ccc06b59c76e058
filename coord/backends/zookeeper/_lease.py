"""The ZooKeeper session as a coord lease, and the policy that applies the wire client's
states.

The wire client (:mod:`._wire`) pings the server and resumes its session on another
connection by itself; coord adds what a lock needs:

* **A local deadline**, as on etcd: a cheap request (``exists`` on the root) every
  ``ttl / 3``; each one answered moves the deadline to its *send* time plus the
  *negotiated* session timeout (the server may clamp the one asked for). The server
  cannot expire the session before that, so a holder cut off from the ensemble learns
  that its lock may be gone no later than the server can give it to someone else.
* **Curator's connection-state policy** (Tech Note 14): SUSPENDED (the connection
  dropped; the session may or may not survive) *interrupts* the lease by default
  (``suspended_is_lost=True``): every hold is void — "I cannot be sure I hold it" is
  treated as "I do not" (tolerating it is how two leaders happen, CURATOR-460) — but the
  session itself lives on: waiters keep their place, and if the client resumes it within
  the timeout nothing else is lost. With ``suspended_is_lost=False`` holds survive a short
  drop and only the deadline (or the server) ends them.
* LOST (the server said the session expired, or no server answered for a whole
  negotiated timeout: Curator's client-side deadline) means the lease is lost. Then the
  session is ended (the client closes it if it can reach a server), so that nodes nobody
  believes it owns do not linger.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from ..._core.exceptions import SessionExpiredError
from .._common.keepalive import KeptAliveLease
from ._wire import State

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from anyio.abc import TaskStatus

__all__ = ["SessionPolicy", "ZooKeeperLease"]

log = logging.getLogger("coord.backends.zookeeper")


class ZooKeeperLease(KeptAliveLease):
    """The ZooKeeper session of a backend: its ephemeral nodes die with it.

    :param ping: sends one request on the session; returns the session timeout the
        server negotiated (seconds), or raises
    :param end: ends the session (closes the wire client)
    """

    def __init__(
        self,
        session_id: int,
        ttl: float,
        *,
        sent_at: float,
        ping: Callable[[int], Awaitable[float]],
        end: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(session_id, ttl, sent_at=sent_at)
        self._ping = ping
        self._end = end
        self._interruptions = 0
        self._interrupted = False
        self._news = anyio.Event()

    @property
    def interruptions(self) -> int:
        return self._interruptions

    @property
    def interrupted(self) -> bool:
        return self._interrupted and not self.lost

    async def wait_interrupted(self, seen: int) -> None:
        while self._interruptions <= seen and not self.lost:
            await self._news.wait()

    async def wait_resumed(self) -> None:
        while self.interrupted:
            await self._news.wait()
        await anyio.lowlevel.checkpoint()

    def _interrupt(self) -> None:
        self._interrupted = True
        self._interruptions += 1
        self._tell()

    def _resume(self) -> None:
        self._interrupted = False
        self._tell()

    def _tell(self) -> None:
        self._news.set()
        self._news = anyio.Event()

    def _mark_lost(self, reason: str) -> None:
        super()._mark_lost(reason)
        self._tell()

    async def _refresh(self) -> float:
        try:
            return await self._ping(self.id)
        except SessionExpiredError:
            return 0.0

    async def _revoke(self) -> None:
        await self._end()


class SessionPolicy:
    """Applies the wire client's connection states to the current lease.

    The news arrive through :meth:`notify`, from the wire client's supervisor task, which
    must not wait on anything; a task of the backend (:meth:`run`) applies them.

    :param is_current: whether news come from the client in use (not a replaced one)
    :param start_soon: runs a coroutine function in the backend's task group
    :param end_session: ends the session with the given id (closes the client), if it
        is still the current one
    """

    def __init__(
        self,
        *,
        suspended_is_lost: bool,
        is_current: Callable[[Any], bool],
        start_soon: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        end_session: Callable[[int], Coroutine[Any, Any, None]],
    ) -> None:
        self.suspended_is_lost = suspended_is_lost
        self._is_current = is_current
        self._start_soon = start_soon
        self._end_session = end_session
        self.lease: ZooKeeperLease | None = None
        self._news: deque[tuple[Any, State, int]] = deque()
        self._wakeup: anyio.Event | None = None
        #: Set (then replaced) at every suspension of the current client's connection.
        self.suspended: anyio.Event | None = None

    def notify(self, client: Any, state: State, session_id: int) -> None:
        """Queue a state change of *client*, whose session is *session_id*. Not a
        checkpoint."""
        self._news.append((client, state, session_id))
        if self._wakeup is not None:
            self._wakeup.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Apply the queued changes as they come. Start with ``tg.start``."""
        self._wakeup, self.suspended = anyio.Event(), anyio.Event()
        task_status.started()
        while True:
            while self._news:
                client, state, session_id = self._news.popleft()
                if state is not State.LOST and not self._is_current(client):
                    continue  # news from a client that was closed or replaced
                if state is State.SUSPENDED:
                    self.suspended.set()
                    self.suspended = anyio.Event()
                self.on_state(state, session_id)
            await self._wakeup.wait()
            self._wakeup = anyio.Event()

    def on_state(self, state: State, session_id: int) -> None:
        """Called for every transition of the current client, and for LOST of any (the
        lease's session may have been replaced by then)."""
        lease = self.lease
        if lease is None or lease.lost:
            return
        if state is State.CLOSED:
            return  # closed on purpose: whoever closed it has dealt with the lease
        if state is State.CONNECTED:
            if session_id == lease.id:
                if lease.interrupted:
                    log.info("ZooKeeper session %#x resumed", lease.id)
                lease._resume()
            else:
                self.lose(lease, "reconnected with a new session: the old one expired")
        elif state is State.SUSPENDED:
            if self.suspended_is_lost and not lease.interrupted:
                log.warning(
                    "ZooKeeper session %#x suspended: its holds are void (suspended_is_lost=True)",
                    lease.id,
                )
                lease._interrupt()
        elif session_id == lease.id:  # LOST
            self.lose(lease, "the server expired the session, or none answered in time")

    def lose(self, lease: ZooKeeperLease, reason: str) -> None:
        """Mark *lease* lost and end its session."""
        if not lease._lost.is_set():
            lease._mark_lost(reason)
            # Bound to this session: by the time the task runs, a new one may be current.
            self._start_soon(lambda: self._end_session(lease.id))
