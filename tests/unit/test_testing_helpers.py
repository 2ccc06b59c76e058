"""coord.testing's waiting helpers wait through a store that does not answer for a while.

A listing that gets no answer raises :exc:`coord.BackendUnavailable` (on ZooKeeper a
batch of reads has the session timeout to answer). ``wait_for_waiters`` failed so once
in the suite: 6 test workers on 2 cores, a burst of waiters, ZooKeeper ("get under
'burst/': no answer"). The helper lists again after a backoff, and so after a watch that
gets no answer (as it opens, or later): a test that waits for a count bounds the wait
itself.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import pytest

import coord
from coord.backends.memory import MemoryBackend, MemoryStore
from coord.testing import expire_session, wait_for_no_waiters, wait_for_waiters

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from coord.abc import Change, Listing

pytestmark = pytest.mark.anyio


class _Unanswered(MemoryBackend):
    """A memory backend whose next *failures* listings get no answer, and whose next
    *watch_failures* watches get none (as they open, or with *later*, at their first
    change)."""

    failures = 0
    listings = 0
    watch_failures = 0
    later = False
    watches = 0
    answered: anyio.Event | None = None  # set as a watch that answers opens

    @contextlib.asynccontextmanager
    async def watch(self, prefix: str, *, revision: int) -> AsyncIterator[AsyncIterator[Change]]:
        self.watches += 1
        failing, self.watch_failures = self.watch_failures > 0, max(self.watch_failures - 1, 0)
        if failing and not self.later:
            raise coord.BackendUnavailable(f"watch of {prefix!r}: no answer")
        async with super().watch(prefix, revision=revision) as changes:
            if not failing:
                if self.answered is not None:
                    self.answered.set()
                yield changes
                return

            async def unanswered() -> AsyncIterator[Change]:
                async for _ in changes:
                    raise coord.BackendUnavailable(f"watch of {prefix!r}: no answer")
                    yield  # (a generator)

            yield unanswered()

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


@pytest.mark.parametrize("later", [False, True], ids=["as it opens", "at a change"])
async def test_wait_for_waiters_lists_again_when_a_watch_gets_no_answer(later: bool) -> None:
    """Two watches that get no answer as they open, or one at its change: the helper
    lists again (and watches again) where it raised BackendUnavailable."""
    store = MemoryStore()
    watcher = _Unanswered(store)
    watcher.later = later
    watcher.watch_failures = 1 if later else 2
    watcher.answered = anyio.Event()
    async with coord.Client(MemoryBackend(store), ttl=5) as a, coord.Client(watcher, ttl=5) as b:
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with a.mutex("m"):
                    await anyio.sleep_forever()

            async def wait() -> None:
                with anyio.fail_after(5):
                    await wait_for_waiters(b, "m", 1)
                tg.cancel_scope.cancel()

            tg.start_soon(wait)
            if later:  # a change for the watch to fail at: a holder comes
                await anyio.wait_all_tasks_blocked()
                assert watcher.watches == 1
            else:  # the holder comes once the helper watches with an answer
                with anyio.fail_after(5):
                    await watcher.answered.wait()
                assert watcher.watches == 3
            tg.start_soon(hold)
        assert watcher.watch_failures == 0


async def test_wait_for_waiters_ends_when_the_session_is_lost_and_the_watch_gets_no_answer() -> (
    None
):
    """A watch that never answers, on a session that is lost for good: the wait raises
    SessionExpiredError (it listed and watched again, about once a second, for ever)."""
    store = MemoryStore()
    watcher = _Unanswered(store)
    watcher.watch_failures = 1_000_000
    async with coord.Client(watcher, ttl=2, renew=False) as client:
        session = client.session
        await expire_session(client)
        with anyio.fail_after(5):
            await session.wait_lost()
        with anyio.fail_after(5), pytest.raises(coord.SessionExpiredError):
            await wait_for_waiters(client, "m", 1)


async def test_a_session_lost_while_the_wait_watches_is_raised_as_itself() -> None:
    """The session is lost while the wait watches, and the listing a change wakes gets no
    answer: SessionExpiredError, itself (it came out of the watch's task group, in an
    exception group)."""
    store = MemoryStore()
    watcher = _Unanswered(store)
    watcher.answered = anyio.Event()
    async with (
        coord.Client(MemoryBackend(store), ttl=5) as other,
        coord.Client(watcher, ttl=2, renew=False) as client,
    ):
        session = client.session
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                with anyio.fail_after(5), pytest.raises(coord.SessionExpiredError):
                    await wait_for_waiters(client, "m", 1)

            tg.start_soon(wait)
            with anyio.fail_after(5):
                await watcher.answered.wait()  # it watches
            watcher.failures = 1_000_000  # and its listings get no answer from now on
            await expire_session(client)
            with anyio.fail_after(5):
                await session.wait_lost()
            async with other.mutex("m"):  # a change: the wait lists again
                pass
