"""ZooKeeper watches, multiplexed: one wire watch callback per kind, listeners per path.

The wire client keeps a set of watch callbacks per path and calls each once when the
watch fires, from its reader task. Passing it the same callable every time (one per
kind, for the whole backend) means a path carries at most one callback and one server
watch however many tasks wait on it; the listeners live here and cost no task.

Listeners are registered *before* the request that arms the watch (CURATOR-527), so an
event that fires between the two is never lost. The wire client keeps its watches
across a resumed session (SetWatches) and fires them with an event of type NONE only
when the session ends; the backend still wakes every listener when the connection is
SUSPENDED or LOST (:meth:`WatchRegistry.wake_all`), so that waiters re-check what they
wait for. A listener that is removed before its watch fires leaves at most the shared
callable in the wire client's table, which does nothing when the watch fires.
"""

from __future__ import annotations

import logging
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, Union

import anyio
from kazoo.protocol.states import EventType

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

__all__ = ["Kind", "WatchRegistry"]

log = logging.getLogger("coord.backends.zookeeper")

Kind = Literal["data", "children"]


class WatchRegistry:
    """Listeners per ``(kind, path)``, woken on the event loop when a watch fires."""

    def __init__(self) -> None:
        # kind -> path -> its listener, or a set of them when there are several (most
        # paths have one: a held lock's guard, a waiter's wait, at ten thousand a time).
        self._listeners: dict[Kind, dict[str, _Listeners]] = {"data": {}, "children": {}}
        self._calls: deque[Callable[[], None]] = deque()  # for run(), in a task
        self._called: anyio.Event | None = None

    def call_in_task(self, func: Callable[[], None]) -> None:
        """Call *func* soon from :meth:`run`'s task (a guard's callback may start a task
        in the backend's task group: not from the wire client's reader, which must not
        wait on anything). Not a checkpoint."""
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
                    log.exception("a ZooKeeper watch callback failed")
            await self._called.wait()

    # The callbacks handed to the wire client (run in its reader task: they never block).

    def data_watcher(self, event: Any) -> None:
        self._fire("data", event.type, event.path)

    def children_watcher(self, event: Any) -> None:
        self._fire("children", event.type, event.path)

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
        listeners = self._listeners[kind]
        present = listeners.get(path)
        if present is None:
            listeners[path] = wake
        elif isinstance(present, set):
            present.add(wake)
        elif present != wake:
            listeners[path] = {present, wake}

    def discard(self, kind: Kind, path: str, wake: Callable[[], None]) -> None:
        """Stop calling *wake* for *path*. Idempotent."""
        listeners = self._listeners[kind]
        present = listeners.get(path)
        if isinstance(present, set):
            present.discard(wake)
            if len(present) == 1:
                listeners[path] = next(iter(present))
        elif present is not None and present == wake:
            del listeners[path]

    def wake_all(self) -> None:
        """Wake every listener, to re-check: the connection dropped, the session ended or
        the client was replaced."""
        for listeners in self._listeners.values():
            for present in list(listeners.values()):
                for wake in _each(present):
                    wake()

    def _fire(self, kind: Kind, event_type: str, path: str | None) -> None:
        if event_type == EventType.NONE or path is None:
            self.wake_all()
            return
        for wake in _each(self._listeners[kind].get(path)):
            wake()


_Listeners = Union["Callable[[], None]", "set[Callable[[], None]]"]


def _each(present: _Listeners | None) -> list[Callable[[], None]]:
    """The listeners of a path, as a list (a copy: a listener may discard itself)."""
    if present is None:
        return []
    return list(present) if isinstance(present, set) else [present]
