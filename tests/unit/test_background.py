"""BackgroundTasks, the task group a session, a client's keeper and a backend own: on
asyncio its ``start_soon`` runs plain asyncio tasks (a fast path: an anyio task costs a
task, an event and a cancel scope more), which must behave as the task group's did, on
both loops: a crash ends the owner's block and is raised one group deep, closing cancels
the tasks as a scope does (again at every checkpoint, their shielded clean-ups let run)
and waits for them, and a cancellation around the owner's block does not reach them."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from coord._core.background import BackgroundTasks

pytestmark = pytest.mark.anyio


async def test_a_crash_ends_the_block_and_is_raised_one_group_deep() -> None:
    tasks = BackgroundTasks()
    reached = False

    async def boom() -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("boom")

    with pytest.raises(ExceptionGroup) as caught:
        await tasks.open()
        try:
            tasks.start_soon(boom)
            with anyio.fail_after(5):
                await anyio.sleep_forever()  # cancelled by the crash
            reached = True
        finally:
            await tasks.aclose()
    assert not reached
    assert [type(e) for e in caught.value.exceptions] == [RuntimeError]


async def test_closing_cancels_every_task_and_waits_for_its_shielded_clean_up() -> None:
    tasks = BackgroundTasks()
    cleaned: list[int] = []
    cancelled_again: list[int] = []

    async def worker(n: int) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)
            cleaned.append(n)

    async def stubborn() -> None:
        # Catches its cancellation and waits again: cancelled again (level, not edge).
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                cancelled_again.append(1)
                raise

    with anyio.fail_after(5):  # (scopes nest: around both open() and aclose())
        await tasks.open()
        for n in range(3):
            tasks.start_soon(worker, n)
        tasks.start_soon(stubborn)
        await anyio.sleep(0.01)
        await tasks.aclose()
    assert sorted(cleaned) == [0, 1, 2]
    assert cancelled_again == [1]


async def test_a_cancelled_scope_a_task_was_started_in_does_not_reach_it() -> None:
    """A task started from inside a scope (as a request's work is, from a caller under
    a timeout) is not in that scope: only closing stops it."""
    tasks = BackgroundTasks()
    ticks: list[int] = []

    async def ticker() -> None:
        while True:
            await anyio.sleep(0.01)
            ticks.append(1)

    await tasks.open()
    try:
        with anyio.CancelScope() as scope:
            tasks.start_soon(ticker)
            scope.cancel()
            await anyio.sleep(1)
        assert scope.cancelled_caught
        before = len(ticks)
        await anyio.sleep(0.1)
        assert len(ticks) > before  # it still runs
    finally:
        await tasks.aclose()
    after = len(ticks)
    await anyio.sleep(0.05)
    assert len(ticks) == after


async def test_a_crash_in_a_clean_up_while_closing_is_raised_by_aclose() -> None:
    tasks = BackgroundTasks()
    started = anyio.Event()

    async def cleans_up_badly() -> None:
        try:
            started.set()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)
            raise RuntimeError("clean-up failed")

    with anyio.fail_after(5):  # (scopes nest: around both open() and aclose())
        await tasks.open()
        tasks.start_soon(cleans_up_badly)
        await started.wait()
        with pytest.raises(ExceptionGroup) as caught:
            await tasks.aclose()
    assert [repr(e) for e in caught.value.exceptions] == [repr(RuntimeError("clean-up failed"))]
