"""The timers of one channel: its calls' deadlines, its connections' keepalive pings and
stall clocks, all run by one task that sleeps in a cancel scope until the earliest is due.

A deadline per call is set and cancelled from synchronous code (a call made, a reply
received), thousands a second: a task or a cancel scope per call would cost more than
the call's own work. So they are kept in a heap (as an event loop keeps its own timers),
and one task per channel sleeps until the first: its scope's deadline is moved earlier
when a sooner timer is set (anyio and trio both let a running scope's deadline move).
A timer cancelled is left in the heap and dropped when it comes up (or when cancelled
ones are most of the heap); it lets go of its callback at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from typing import TYPE_CHECKING

import anyio

_log = logging.getLogger("coord.backends.etcd")

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

__all__ = ["Timer", "Timers"]

#: Cancelled timers kept in the heap at most, as a share of it (and over a floor).
_SWEEP_FLOOR = 100


class Timer:
    """One timer: :meth:`cancel` it, or it calls its callback once, when due."""

    __slots__ = ("_timers", "callback", "when")

    def __init__(self, timers: Timers, when: float, callback: Callable[[], None]) -> None:
        self._timers = timers
        self.when = when
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        """Not a checkpoint; idempotent."""
        if self.callback is not None:
            self.callback = None
            self._timers._cancelled()


class Timers:
    """The timers of one channel.

    :param clock: the event loop's clock (cancel scope deadlines are on it)
    :param spawn: starts the task that runs them (``TaskGroup.start_soon``), at the first
        timer
    """

    def __init__(
        self,
        clock: Callable[[], float],
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object],
    ) -> None:
        self.clock = clock
        self._spawn = spawn
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._dead = 0  # cancelled timers still in the heap
        self._scope: anyio.CancelScope | None = None  # the sleeping task's
        self._running = False
        self._closed = False
        self._stop: anyio.CancelScope | None = None  # the task's whole scope

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.clock() + delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call *callback* at *when* (on :attr:`clock`), in the timers' task. Not a
        checkpoint. After :meth:`close`, the timer never fires."""
        timer = Timer(self, when, callback)
        if self._closed:
            timer.callback = None
            return timer
        heapq.heappush(self._heap, (when, next(self._order), timer))
        if not self._running:
            self._running = True
            self._spawn(self._run)
        elif self._scope is not None and when < self._scope.deadline:
            self._scope.deadline = when
        return timer

    def close(self) -> None:
        """Stop the task; no timer fires after this. Not a checkpoint."""
        self._closed = True
        self._heap.clear()
        if self._stop is not None:
            self._stop.cancel()

    def _cancelled(self) -> None:
        self._dead += 1
        if self._dead > _SWEEP_FLOOR and 2 * self._dead > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].callback is not None]
            heapq.heapify(self._heap)
            self._dead = 0

    async def _run(self) -> None:
        if self._closed:
            return
        with anyio.CancelScope() as self._stop:
            while True:
                heap = self._heap  # (swept: a new list)
                due = heap[0][0] if heap else math.inf
                with anyio.CancelScope(deadline=due) as scope:
                    self._scope = scope
                    await anyio.sleep_forever()
                self._scope = None
                self._fire()

    def _fire(self) -> None:
        heap, now = self._heap, self.clock()
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            callback = timer.callback
            if callback is None:
                self._dead = max(self._dead - 1, 0)
                continue
            timer.callback = None
            try:
                callback()
            except Exception:  # a bug: the other timers still fire
                _log.exception("an etcd transport timer failed")
