"""coord.testing's waiting helpers wait through a store that does not answer for a while.

A listing that gets no answer raises :exc:`coord.BackendUnavailable` (on ZooKeeper a
batch of reads has the session timeout to answer). ``wait_for_waiters`` failed so once
in the suite: 6 test workers on 2 cores, a burst of waiters, ZooKeeper ("get under
'burst/': no answer"). The helper lists again after a backoff: a test that waits for a
count bounds the wait itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import anyio.abc
import pytest

import coord
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import wait_for_no_waiters, wait_for_waiters

if TYPE_CHECKING:
    from coord.abc import Listing

pytestmark = pytest.mark.anyio


class _Unanswered(MemoryBackend):
    """A memory backend whose next *failures* listings get no answer."""

    failures = 0
    listings = 0

    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        self.listings += 1
        if self.failures:
            self.failures -= 1
            raise coord.BackendUnavailable(f"get under {prefix!r}: no answer")
        return await super().entries(prefix, limit=limit, stale_ok=stale_ok)


async def test_wait_for_waiters_lists_again_when_a_listing_gets_no_answer() -> None:
    store = MemoryStore()
    watcher = _Unanswered(store)
    async with coord.Client(MemoryBackend(store), ttl=5) as a, coord.Client(watcher, ttl=5) as b:
        go = anyio.Event()

        async def hold(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            async with a.mutex("m"):
                task_status.started()
                await go.wait()
                watcher.failures = 2  # the listings woken by the release get no answer
                watcher.listings = 0

        async with anyio.create_task_group() as tg:
            await tg.start(hold)  # held
            watcher.failures = 2
            with anyio.fail_after(5):
                await wait_for_waiters(b, "m", 1)
            assert watcher.failures == 0
            assert watcher.listings == 3
            # Also a listing woken by a change (the release), for the other helper.
            go.set()
            with anyio.fail_after(5):
                await wait_for_no_waiters(b, "m")
        assert watcher.failures == 0
        assert watcher.listings >= 3  # two unanswered, then the one that tells
