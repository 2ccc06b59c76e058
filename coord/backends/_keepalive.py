"""A lease kept alive by periodic refreshes, with a local deadline (etcd's model).

The keepalive refreshes every ``ttl / 3``. Each acknowledged refresh moves the local
deadline to *send time* + granted TTL: measuring from the send time, not from receipt,
means that a reply delayed in the network never makes us believe the lease lives longer
than the store does. When the deadline passes without a refresh, or the store answers that
the lease is gone, the lease is lost; nothing un-loses it.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import TYPE_CHECKING

import anyio

from .._exceptions import BackendError
from ..abc import Lease

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

__all__ = ["KeptAliveLease"]

# After a failed refresh, retry this soon (capped by the regular interval): a store that
# comes back within the TTL must see a refresh before the lease runs out.
RETRY_DELAY = 0.25
_log = logging.getLogger("coord.lease")


class KeptAliveLease(Lease):
    """Base for leases refreshed by the client. Subclasses implement the two calls."""

    def __init__(self, lease_id: int, ttl: float, *, sent_at: float) -> None:
        self._id = lease_id
        self._ttl = ttl
        self._deadline = sent_at + ttl
        self._lost = anyio.Event()
        self._scope = anyio.CancelScope()

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    @property
    def deadline(self) -> float:
        """The local deadline (``anyio.current_time()`` clock) after which the lease is lost."""
        return self._deadline

    async def wait_lost(self) -> None:
        await self._lost.wait()

    @abstractmethod
    async def _refresh(self) -> float:
        """Send one keepalive; return the TTL the store granted (<= 0: the lease is gone)."""

    @abstractmethod
    async def _revoke(self) -> None:
        """Ask the store to end the lease."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the lease alive until it is revoked or lost. Start with ``tg.start``."""
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watchdog)
                    task_status.started()
                    await self._keepalive_loop()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stopped()

    async def _stopped(self) -> None:
        """Called when the keepalive stops (revoked, lost or cancelled): free resources."""

    async def revoke(self) -> None:
        """Stop the keepalive, then end the lease on the store. Marks the lease lost."""
        self._scope.cancel()
        try:
            if not self.lost:
                await self._revoke()
        finally:
            self._mark_lost()

    def _mark_lost(self) -> None:
        self._lost.set()
        self._scope.cancel()

    async def _keepalive_loop(self) -> None:
        interval = self._ttl / 3
        delay = interval
        while True:
            await anyio.sleep(delay)
            sent = anyio.current_time()
            try:
                with anyio.move_on_after(max(self._deadline - sent, 0)):
                    granted = await self._refresh()
                    if granted <= 0:
                        self._mark_lost()
                        return
                    self._deadline = max(self._deadline, sent + granted)
                    delay = interval
                    continue
            except BackendError:
                pass
            except Exception:
                # A bug, but this task lives in the user's task group: a keepalive that
                # cannot be sent is a failed refresh (the deadline still protects us).
                _log.exception("lease keepalive failed")
            delay = min(interval, RETRY_DELAY)

    async def _watchdog(self) -> None:
        # A timer, not a poll: it sleeps exactly until the deadline, which refreshes move.
        while (remaining := self._deadline - anyio.current_time()) > 0:  # noqa: ASYNC110
            await anyio.sleep(remaining)
        self._mark_lost()
