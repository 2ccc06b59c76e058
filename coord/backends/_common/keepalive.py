"""A lease kept alive by periodic refreshes, with a local deadline (etcd's model).

The keepalive refreshes every ``ttl / 3``. Each acknowledged refresh moves the local
deadline to *send time* + granted TTL: measuring from the send time, not from receipt,
means that a reply delayed in the network never makes us believe the lease lives longer
than the store does. When the deadline passes without a refresh, or the store answers that
the lease is gone, the lease is lost; nothing un-loses it. ``lost`` reads the clock, so a
process that was paused past its deadline knows it at once, before any task has run.

A refresh that gets no answer within ``ttl / 3`` is abandoned (:meth:`_unanswered` lets
the backend move to another member) and tried again soon: a hung member must not cost
the lease while other members answer.

The keepalive never raises into its task group: an unexpected error is logged and
counts as a failed refresh, and however the keepalive ends (revoked, cancelled, crashed)
the lease is marked lost, so that every holder hears of it.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from typing import TYPE_CHECKING

import anyio

from ..._core.exceptions import BackendError
from ...abc import Lease

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskStatus

__all__ = ["KeptAliveLease"]

# After a failed refresh, retry this soon (capped by the regular interval): a store that
# comes back within the TTL must see a refresh before the lease runs out.
RETRY_DELAY = 0.25
_log = logging.getLogger("coord.backends.lease")


class KeptAliveLease(Lease):
    """Base for leases refreshed by the client. Subclasses implement the two calls.

    :param sent_at: send time (``anyio.current_time()``) of the answered grant request
    """

    def __init__(self, lease_id: int, ttl: float, *, sent_at: float) -> None:
        self._id = lease_id
        self._ttl = ttl
        self._deadline = sent_at + ttl
        self._lost = anyio.Event()
        self._scope = anyio.CancelScope()
        self._now = _clock()  # `lost` reads it at every check of every waiter and hold
        self._gone = False  # the store said the lease no longer exists
        self._why_failed = "?"  # why the last refresh failed (for the log)
        #: Why the lease was lost (None while it is not).
        self.reason: str | None = None

    def __repr__(self) -> str:
        state = f"lost: {self.reason}" if self.lost else "live"
        return f"<{type(self).__name__} {self._id:#x} ttl={self._ttl:g} {state}>"

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def deadline(self) -> float:
        return self._deadline

    @property
    def lost(self) -> bool:
        if self._lost.is_set():
            return True
        try:
            return self._now() >= self._deadline
        except RuntimeError:  # no event loop (a repr after the run): the last known state
            return False

    async def wait_lost(self) -> None:
        await self._lost.wait()

    @abstractmethod
    async def _refresh(self) -> float:
        """Send one keepalive; return the TTL the store granted (<= 0: the lease is gone)."""

    @abstractmethod
    async def _revoke(self) -> None:
        """Ask the store to end the lease."""

    async def _unanswered(self) -> None:
        """A refresh got no answer within ``ttl / 3``: e.g. give up on that member."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the lease alive until it is revoked or lost. Start with ``tg.start``.

        Never raises (but cancellation); whichever way it ends, the lease is lost.
        """
        try:
            with self._scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._watchdog)
                    task_status.started()
                    await self._keepalive_loop()
        except Exception:  # a bug: the holders must hear of it, the user's tasks must not
            _log.exception("the keepalive of lease %#x failed", self._id)
        finally:
            self._mark_lost("keepalive stopped")
            with anyio.CancelScope(shield=True):
                await self._stopped()

    async def _stopped(self) -> None:
        """Called when the keepalive stops (revoked, lost or cancelled): free resources."""

    async def revoke(self) -> None:
        """Stop the keepalive, then end the lease on the store. Marks the lease lost."""
        self._scope.cancel()
        try:
            if not self._gone:
                await self._revoke()
        finally:
            self._mark_lost("revoked")

    def _mark_lost(self, reason: str) -> None:
        if not self._lost.is_set():
            self.reason = reason
            self._lost.set()
        self._scope.cancel()

    async def _keepalive_loop(self) -> None:
        # Each refresh goes out ttl / 3 after the send time of the last acknowledged one
        # (the grant's, at first: a grant that was retried while the store was down is
        # refreshed at once), and again every RETRY_DELAY while refreshes fail.
        interval = self._ttl / 3
        next_send = self._deadline - self._ttl + interval
        failed = 0  # refreshes that failed in a row: one WARNING at the first, one INFO after
        while True:
            await anyio.sleep(max(next_send - anyio.current_time(), 0))
            sent = anyio.current_time()
            if sent >= self._deadline:
                self._mark_lost("no keepalive was acknowledged before the deadline")
                return
            next_send = sent + min(interval, RETRY_DELAY)
            granted = await self._refresh_once(min(interval, self._deadline - sent))
            if granted is None:
                failed += 1
                if failed == 1:
                    _log.warning(
                        "lease %#x: a keepalive failed (%s); retrying (%.1fs left)",
                        self._id,
                        self._why_failed,
                        self._deadline - anyio.current_time(),
                    )
                continue
            if granted <= 0:
                self._gone = True
                self._mark_lost("the store says the lease is gone")
                return
            if anyio.current_time() >= self._deadline:
                # Answered, but too late: it may have been renewed after it had expired
                # locally, and a lost lease never comes back.
                self._mark_lost("the keepalive was acknowledged after the deadline")
                return
            self._deadline = max(self._deadline, sent + granted)
            next_send = sent + interval
            if failed:
                _log.info("lease %#x renewed after %d failed keepalives", self._id, failed)
                failed = 0

    async def _refresh_once(self, limit: float) -> float | None:
        """One refresh within *limit* seconds; None if it failed or got no answer in time."""
        with anyio.move_on_after(limit) as scope:
            try:
                return await self._refresh()
            except BackendError as exc:
                self._why_failed = str(exc) or type(exc).__name__
                return None
            except Exception:
                # A bug, but this task lives in the backend's task group: a keepalive
                # that cannot be sent is a failed refresh (the deadline still protects us).
                _log.exception("lease %#x keepalive failed", self._id)
                return None
        if scope.cancelled_caught:
            self._why_failed = f"no answer in {limit:.1f}s"
            try:
                await self._unanswered()
            except Exception:
                _log.exception("lease %#x: giving up on a member failed", self._id)
        return None

    async def _watchdog(self) -> None:
        # A timer, not a poll: it sleeps exactly until the deadline, which refreshes move.
        while (remaining := self._deadline - anyio.current_time()) > 0:  # noqa: ASYNC110
            await anyio.sleep(remaining)
        self._mark_lost("the deadline passed without an acknowledged keepalive")


def _clock() -> Callable[[], float]:
    """``anyio.current_time`` of the running event loop, looked up once: on asyncio the
    loop's own clock (what anyio reads), elsewhere anyio's (trio's, a test's MockClock)."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        return anyio.current_time
