"""The ZooKeeper session as a coord lease, and the policy that decides when it is lost.

There is no keepalive to run: kazoo pings the server and reconnects by itself. What coord
adds is Curator's connection-state policy (Tech Note 14):

* SUSPENDED (the connection dropped; the session may or may not survive) counts as lost
  by default (``suspended_is_lost=True``): "I cannot be sure I still hold it" is treated
  as "I do not". Tolerating SUSPENDED is how two leaders happen (CURATOR-460).
* With ``suspended_is_lost=False`` only LOST (the server said the session expired) counts,
  plus a client-side timer: if the connection has not come back one session timeout after
  it was suspended, the session is presumed expired even when no server can say so.
* Reconnecting with a different session id means the old session expired unseen.

Once lost, the session is ended (kazoo closes it if it can reach a server, otherwise it
expires there), so that nodes nobody believes it owns do not linger, and kazoo does not
carry on with a new session that no lease stands for.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
from kazoo.protocol.states import KazooState

from ...abc import Lease

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from anyio.abc import TaskStatus

__all__ = ["SessionPolicy", "ZooKeeperLease"]

log = logging.getLogger("coord.backends.zookeeper")


class ZooKeeperLease(Lease):
    """The ZooKeeper session of a backend: its ephemeral nodes die with it.

    :ivar reason: why the lease was lost (None while it is not)
    """

    def __init__(self, session_id: int, ttl: float, end: Callable[[], Awaitable[None]]) -> None:
        self._id = session_id
        self._ttl = ttl
        self._end = end
        self._lost = anyio.Event()
        self.reason: str | None = None

    def __repr__(self) -> str:
        state = f"lost: {self.reason}" if self.lost else "live"
        return f"<ZooKeeperLease session={self._id:#x} ttl={self._ttl:g} {state}>"

    @property
    def id(self) -> int:
        """The session id."""
        return self._id

    @property
    def ttl(self) -> float:
        """The session timeout asked for, in seconds (the server may clamp it to its
        ``minSessionTimeout`` / ``maxSessionTimeout``)."""
        return self._ttl

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        """Return when the session is lost. A checkpoint."""
        await self._lost.wait()

    async def revoke(self) -> None:
        """Close the session on the server (its ephemeral nodes go) and mark it lost.

        Shielded: cancelling this call does not stop the close.
        """
        if self.lost:
            return
        self._mark_lost("revoked")
        await self._end()

    def _mark_lost(self, reason: str) -> bool:
        if self.lost:
            return False
        self.reason = reason
        self._lost.set()
        return True


class SessionPolicy:
    """Applies kazoo's connection states to the current lease.

    kazoo's news arrive through :meth:`notify`, a loop callback outside any task; a task
    (:meth:`run`) applies them, since that creates events and tasks, which anyio allows
    only inside a task.

    :param is_current: whether news come from the client in use (not a stopped one)
    :param start_soon: runs a coroutine function in the backend's task group
    :param end_session: ends the kazoo session (stops the client)
    """

    def __init__(
        self,
        *,
        suspended_is_lost: bool,
        is_current: Callable[[Any], bool],
        start_soon: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        end_session: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        self.suspended_is_lost = suspended_is_lost
        self._is_current = is_current
        self._start_soon = start_soon
        self._end_session = end_session
        self.lease: ZooKeeperLease | None = None
        self._timer: anyio.CancelScope | None = None
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
                self._stop_timer()
            else:
                self.lose(lease, "reconnected with a new session: the old one expired")
        elif state == KazooState.SUSPENDED:
            if self.suspended_is_lost:
                self.lose(lease, "connection suspended (suspended_is_lost=True)")
            elif self._timer is None:
                timer = self._timer = anyio.CancelScope()
                self._start_soon(lambda: self._expire_after_timeout(lease, timer))
        else:
            self.lose(lease, "session expired or closed")

    def lose(self, lease: ZooKeeperLease, reason: str) -> None:
        """Mark *lease* lost and end its session."""
        self._stop_timer()
        if lease._mark_lost(reason):
            log.warning("coord: ZooKeeper session %#x lost: %s", lease.id, reason)
            self._start_soon(self._end_session)

    def _stop_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    async def _expire_after_timeout(self, lease: ZooKeeperLease, timer: anyio.CancelScope) -> None:
        # A timer, not a poll: it sleeps once, for the session timeout, unless the
        # reconnection cancels it.
        with timer:
            await anyio.sleep(lease.ttl)
            self.lose(lease, f"no connection for a whole session timeout ({lease.ttl:g}s)")
