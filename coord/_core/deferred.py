"""Deferred starts: run a function once a delay has passed, as a task of a session's
task group (:meth:`Deferred.start_after`) or as a plain call (:meth:`Deferred.call_after`).

One task per session sleeps until the earliest due time, so that deferring costs a heap
push, not a task and a timer each. The holds use it to arm their guard watch (see
:mod:`coord._locks.hold`): most holds of a busy lock end long before their guard would matter,
and a start that is due after its hold ended does nothing.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from typing import TYPE_CHECKING

import anyio

from .exceptions import ClosedError, SessionExpiredError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    StartSoon = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]

__all__ = ["Deferred", "Start"]

_log = logging.getLogger("coord")

#: Seconds by which a start may come early, so that one wake-up of the runner starts (or
#: skips, cancelled) all that is due within that span.
_SLACK = 0.05


class Start:
    """One deferred start; :meth:`cancel` it while it waits and it never runs (nor keeps
    its function alive)."""

    __slots__ = ("call", "due", "func", "order")

    def __init__(self, due: float, order: int, func: Callable[[], Any], *, call: bool) -> None:
        self.due: float = due
        self.order: int = order
        self.func: Callable[[], Any] | None = func
        self.call: bool = call  # call func() on the runner; else start it as a task

    def __lt__(self, other: Start) -> bool:
        return (self.due, self.order) < (other.due, other.order)

    def cancel(self) -> None:
        """Not a checkpoint."""
        self.func = None


class Deferred:
    """Starts functions after a delay, through *start_soon* (a task group's)."""

    def __init__(self, start_soon: StartSoon) -> None:
        self._start_soon = start_soon
        self._due: list[Start] = []
        self._order = itertools.count()  # equal due times start in call order
        self._changed: anyio.Event | None = None
        self._running = False

    def __len__(self) -> int:
        return len(self._due)

    def start_after(self, delay: float, func: Callable[[], Coroutine[Any, Any, None]]) -> Start:
        """Start ``func()`` as a task *delay* seconds from now, unless the returned
        :class:`Start` is cancelled first. Not a checkpoint.

        :raises ClosedError: if the task group is closed (or what its owner raises then)
        """
        return self._push(Start(anyio.current_time() + delay, next(self._order), func, call=False))

    def call_after(self, delay: float, func: Callable[[], None]) -> Start:
        """Call ``func()`` *delay* seconds from now, on the runner task (it must not block;
        an exception it raises is logged), unless the returned :class:`Start` is
        cancelled first. Not a checkpoint.

        :raises ClosedError: if the task group is closed
        """
        return self._push(Start(anyio.current_time() + delay, next(self._order), func, call=True))

    def _push(self, entry: Start) -> Start:
        heapq.heappush(self._due, entry)
        if not self._running:
            self._start_soon(self._run)
            self._running = True
        elif self._due[0] is entry and self._changed is not None:
            self._changed.set()  # it is due before whatever the runner sleeps for
        return entry

    async def _run(self) -> None:
        while True:
            self._changed = anyio.Event()
            if not self._due:
                await self._changed.wait()
                continue
            # What is due within _SLACK is started now: on a busy lock a hold ends (and
            # its guard's start is cancelled) every few milliseconds, and one wake-up for
            # each would cost more than the guards it skips. (It sleeps until half that
            # before: never a sleep too short for the clock to pass.)
            wait = self._due[0].due - anyio.current_time()
            if wait > _SLACK:
                wait -= _SLACK / 2
                with anyio.move_on_after(wait):
                    await self._changed.wait()
                continue
            start = heapq.heappop(self._due)
            func = start.func
            if func is None:
                continue  # cancelled
            if start.call:
                try:
                    func()
                except Exception:
                    _log.exception("a deferred call failed")
                continue
            try:
                self._start_soon(func)
            except (ClosedError, SessionExpiredError):
                return  # the session is over, or closing: so is this task
