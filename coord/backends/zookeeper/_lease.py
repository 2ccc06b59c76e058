"""The ZooKeeper session as a coord lease, and the policy that applies kazoo's states.

kazoo pings the server and reconnects by itself; coord adds what a lock needs:

* **A local deadline**, as on etcd: a cheap request (``exists`` on the root) every
  ``ttl / 3``; each one answered moves the deadline to its *send* time plus the
  *negotiated* session timeout (the server may clamp the one asked for). The server
  cannot expire the session before that, so a holder cut off from the ensemble learns
  that its lock may be gone no later than the server can give it to someone else.
* **Curator's connection-state policy** (Tech Note 14): SUSPENDED (the connection
  dropped; the session may or may not survive) *interrupts* the lease by default
  (``suspended_is_lost=True``): every hold is void — "I cannot be sure I hold it" is
  treated as "I do not" (tolerating it is how two leaders happen, CURATOR-460) — but the
  session itself lives on: waiters keep their place, and if kazoo reconnects to it within
  the timeout nothing else is lost. With ``suspended_is_lost=False`` holds survive a short
  drop and only the deadline (or the server) ends them.
* LOST (the server said the session expired) or reconnecting with a different session
  id means the lease is lost. Then the session is ended (kazoo closes it if it can reach
  a server), so that nodes nobody believes it owns do not linger.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from kazoo.protocol.states import KazooState

from ..._exceptions import SessionExpiredError
from .._keepalive import KeptAliveLease

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from anyio.abc import TaskStatus

__all__ = ["SessionPolicy", "ZooKeeperLease"]

log = logging.getLogger("coord.backends.zookeeper")


class ZooKeeperLease(KeptAliveLease):
    """The ZooKeeper session of a backend: its ephemeral nodes die with it.

    :param ping: sends one request on the session; returns the session timeout the
        server negotiated (seconds), or raises
    :param end: ends the session (stops the kazoo client)
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
    """Applies kazoo's connection states to the current lease.

    kazoo's news arrive through :meth:`notify`, a loop callback outside any task; a task
    (:meth:`run`) applies them, since that creates events and tasks, which anyio allows
    only inside a task.

    :param is_current: whether news come from the client in use (not a stopped one)
    :param start_soon: runs a coroutine function in the backend's task group
    :param end_session: ends the kazoo session with the given id (stops the client),
        if it is still the client's
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
        self._news: deque[tuple[Any, str, int]] = deque()
        self._wakeup: anyio.Event | None = None
        #: Set (then replaced) at every suspension of the current client's connection.
        self.suspended: anyio.Event | None = None

    def notify(self, client: Any, state: str, session_id: int) -> None:
        """Queue a state change of *client* (on the loop, outside any task)."""
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
                if not self._is_current(client):
                    continue  # news from a client that was stopped or replaced
                if state == KazooState.SUSPENDED:
                    self.suspended.set()
                    self.suspended = anyio.Event()
                self.on_state(state, session_id)
            await self._wakeup.wait()
            self._wakeup = anyio.Event()

    def on_state(self, state: str, session_id: int) -> None:
        """Called for every CONNECTED / SUSPENDED / LOST transition of the current client."""
        lease = self.lease
        if lease is None or lease.lost:
            return
        if state == KazooState.CONNECTED:
            if session_id == lease.id:
                if lease.interrupted:
                    log.info("coord: ZooKeeper session %#x resumed", lease.id)
                lease._resume()
            else:
                self.lose(lease, "reconnected with a new session: the old one expired")
        elif state == KazooState.SUSPENDED:
            if self.suspended_is_lost and not lease.interrupted:
                log.warning(
                    "coord: ZooKeeper session %#x suspended: its holds are void "
                    "(suspended_is_lost=True)",
                    lease.id,
                )
                lease._interrupt()
        else:
            self.lose(lease, "the server expired or closed the session")

    def lose(self, lease: ZooKeeperLease, reason: str) -> None:
        """Mark *lease* lost and end its session."""
        if not lease._lost.is_set():
            lease._mark_lost(reason)
            # Bound to this session: by the time the task runs, a new one may be current.
            self._start_soon(lambda: self._end_session(lease.id))
