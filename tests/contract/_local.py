"""Helpers for cohort-mode tests: queue tasks of one client locally behind a mutex."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio.lowlevel

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    import coord


async def queue_locally(tg: TaskGroup, mutex: coord.Mutex, count: int, order: list[int]) -> None:
    """Start *count* tasks that take *mutex* in turn (recording their fences in *order*),
    and return once all of them wait (local state: no request to the store)."""
    for _ in range(count):
        before = mutex.statistics().tasks_waiting

        async def take() -> None:
            async with mutex as hold:
                order.append(hold.fence)

        tg.start_soon(take)
        while mutex.statistics().tasks_waiting == before:
            await anyio.lowlevel.checkpoint()
