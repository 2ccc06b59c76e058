"""A list that tests can wait on: ``await rec.wait_for(lambda items: ...)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class Recorder(Generic[T]):
    def __init__(self) -> None:
        self.items: list[T] = []
        self._changed = anyio.Event()

    def append(self, item: T) -> None:
        self.items.append(item)
        self._changed.set()
        self._changed = anyio.Event()

    def __len__(self) -> int:
        return len(self.items)

    async def wait_for(self, done: Callable[[list[T]], bool]) -> None:
        """Wait (10 s at most) until ``done(items)``."""
        with anyio.fail_after(10):
            while not done(self.items):
                await self._changed.wait()
