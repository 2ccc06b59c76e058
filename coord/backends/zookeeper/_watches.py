"""ZooKeeper watches, multiplexed: one kazoo watcher per kind, listeners per path.

kazoo keeps a set of watcher callables per path and calls each once when the watch
fires. Passing it the same callable every time (one per kind, for the whole backend)
means a path carries at most one kazoo watcher and one server watch however many tasks
wait on it; the listeners live here, on the event loop, and cost no task and no thread.

Listeners are registered *before* the request that arms the watch (CURATOR-527), so an
event that fires between the two is never lost. A disconnect kills every server watch:
kazoo then fires every watcher with an event of type NONE, and every listener is woken
to re-check. A listener that is removed before its watch fires leaves at most the shared
callable in kazoo's table, which does nothing when the watch eventually fires.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio
from kazoo.protocol.states import EventType

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from ._bridge import Bridge

__all__ = ["Kind", "WatchRegistry"]

log = logging.getLogger("coord.backends.zookeeper")

Kind = Literal["data", "children"]


class WatchRegistry:
    """Listeners per ``(kind, path)``, woken on the event loop when a watch fires."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._listeners: defaultdict[tuple[Kind, str], set[Callable[[], None]]] = defaultdict(set)
        self._calls: deque[Callable[[], None]] = deque()  # for run(), in a task
        self._called: anyio.Event | None = None

    def call_in_task(self, func: Callable[[], None]) -> None:
        """Call *func* soon from :meth:`run`'s task (a guard's callback may start a task,
        which a loop callback, outside any task, cannot). Not a checkpoint."""
        self._calls.append(func)
        if self._called is not None:
            self._called.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Make the calls of :meth:`call_in_task`, until cancelled (start with ``tg.start``)."""
        task_status.started()
        while True:
            self._called = anyio.Event()
            while self._calls:
                func = self._calls.popleft()
                try:
                    func()
                except Exception:  # pragma: no cover - callbacks set flags, start tasks
                    log.exception("coord: a ZooKeeper watch callback failed")
            await self._called.wait()

    # The callables handed to kazoo (run on kazoo's callback thread: they must not block).

    def data_watcher(self, event: Any) -> None:
        self._bridge.to_loop(self._fire, "data", event.type, event.path)

    def children_watcher(self, event: Any) -> None:
        self._bridge.to_loop(self._fire, "children", event.type, event.path)

    # On the event loop.

    @contextmanager
    def listening(
        self, kind: Kind, paths: Iterable[str], wake: Callable[[], None]
    ) -> Iterator[None]:
        """Call *wake* whenever a *kind* watch fires on one of *paths*, or on a disconnect."""
        paths = list(paths)
        for path in paths:
            self.add(kind, path, wake)
        try:
            yield
        finally:
            for path in paths:
                self.discard(kind, path, wake)

    def add(self, kind: Kind, path: str, wake: Callable[[], None]) -> None:
        """Call *wake* whenever a *kind* watch fires on *path*, or on a disconnect."""
        self._listeners[(kind, path)].add(wake)

    def discard(self, kind: Kind, path: str, wake: Callable[[], None]) -> None:
        """Stop calling *wake* for *path*. Idempotent."""
        listeners = self._listeners.get((kind, path))
        if listeners is not None:
            listeners.discard(wake)
            if not listeners:
                del self._listeners[(kind, path)]

    def wake_all(self) -> None:
        """Wake every listener: their watches are gone (disconnect, client replaced)."""
        for listeners in list(self._listeners.values()):
            for wake in list(listeners):
                wake()

    def _fire(self, kind: Kind, event_type: str, path: str | None) -> None:
        if event_type == EventType.NONE or path is None:
            self.wake_all()
            return
        for wake in list(self._listeners.get((kind, path), ())):
            wake()
