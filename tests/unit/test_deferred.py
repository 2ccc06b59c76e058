"""Deferred starts (the holds' guard watches), on trio's MockClock."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from trio.testing import MockClock

from coord._core.deferred import _SLACK, Deferred
from coord._core.exceptions import ClosedError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def test_starts_each_at_its_due_time_in_due_order() -> None:
    started: list[tuple[str, float]] = []

    async def noop() -> None:
        pass

    funcs: dict[object, str] = {}

    def start_soon(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        started.append((funcs.get(func, "runner"), round(anyio.current_time() - t0, 3)))
        tg.start_soon(func)

    async with anyio.create_task_group() as tg:
        deferred = Deferred(start_soon)
        t0 = anyio.current_time()

        def later(delay: float, name: str) -> None:
            func = partial(noop)  # a distinct object per name: the record tells them apart
            funcs[func] = name
            deferred.start_after(delay, func)

        later(3.0, "c")
        later(1.0, "a")  # due before the one the runner waits for
        await anyio.sleep(0.5)
        later(1.5, "b")
        later(1.5, "b2")  # the same due time: started in call order
        await anyio.sleep(5)
        assert len(deferred) == 0
        later(1.0, "d")  # after the runner went idle
        await anyio.sleep(2)
        tg.cancel_scope.cancel()
    runner = started.pop(0)  # the runner itself, started at the first call
    assert runner[1] == 0.0
    assert [name for name, _ in started] == ["a", "b", "b2", "c", "d"]
    # Each at its due time, or up to _SLACK before (one wake-up starts all of a span).
    for (_, at), due in zip(started, [1.0, 2.0, 2.0, 3.0, 6.5], strict=True):
        assert due - _SLACK <= at <= due


async def test_nothing_starts_once_the_group_is_closed() -> None:
    started: list[str] = []
    closed = False

    def start_soon(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if closed:
            raise ClosedError("closed")
        tg.start_soon(func)

    async def run() -> None:
        started.append("ran")

    async with anyio.create_task_group() as tg:
        deferred = Deferred(start_soon)
        deferred.start_after(1.0, run)
        deferred.start_after(2.0, run)
        await anyio.sleep(1.5)
        closed = True
        await anyio.sleep(1.0)  # the runner's start fails: it ends quietly
    assert started == ["ran"]


async def test_a_cancelled_start_never_runs_nor_keeps_its_function() -> None:
    started: list[str] = []

    async def run() -> None:
        started.append("ran")

    async with anyio.create_task_group() as tg:

        def start_soon(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
            tg.start_soon(func)

        deferred = Deferred(start_soon)
        first = deferred.start_after(1.0, run)
        deferred.start_after(2.0, run)
        first.cancel()
        assert first.func is None  # (a released hold is not kept alive by its start)
        await anyio.sleep(3)
        assert len(deferred) == 0
        tg.cancel_scope.cancel()
    assert started == ["ran"]


async def test_starts_due_close_together_share_one_wake_up() -> None:
    """A busy lock defers a guard start every few milliseconds: what is due within
    _SLACK is started by one wake-up of the runner, not one wake-up each."""
    called: list[float] = []
    async with anyio.create_task_group() as tg:
        deferred = Deferred(lambda func: tg.start_soon(func) and None)
        t0 = anyio.current_time()
        for i in range(100):  # due 1 ms apart, over 0.1 s
            deferred.call_after(1.0 + i / 1000, lambda: called.append(anyio.current_time() - t0))
        await anyio.sleep(2)
        tg.cancel_scope.cancel()
    assert len(called) == 100
    assert len(set(called)) <= 5  # a wake-up every 25 ms at most (half of _SLACK = 0.05)
