"""One-shot watches: which callbacks wait on which path, and firing them.

The server keeps a watch per connection and fires it once. The client keeps the
callbacks, in three tables as ZooKeeper's Java client does (``ZKWatchManager``):

* **data**: armed by ``get_data``, or ``exists`` on a node that exists;
* **exist**: armed by ``exists`` on a node that does not (fires when it is created);
* **child**: armed by ``get_children``.

A watch is registered when the reply that armed it is read (by the reader task, before
the next frame), never later: the server may send the event right after the reply.
The tables outlive a connection: a resumed session re-arms every path with SetWatches.
Callbacks run on the event loop, in the reader task: they must not block or await
(set an event, send on a memory stream; :class:`Watcher` is the ready-made one).
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, NamedTuple, Protocol, Union

import anyio
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Arming", "Kind", "WatchCallback", "Watcher", "Watches"]

log = logging.getLogger("coord.backends.zookeeper")

_CREATED, _DELETED, _CHANGED, _CHILD = 1, 2, 3, 4
_EVENT_TYPES = {
    _CREATED: EventType.CREATED,
    _DELETED: EventType.DELETED,
    _CHANGED: EventType.CHANGED,
    _CHILD: EventType.CHILD,
}


class WatchCallback(Protocol):
    """Called once, on the event loop, with kazoo's ``WatchedEvent``; must not block."""

    def __call__(self, event: WatchedEvent, /) -> object: ...


class Kind(enum.Enum):
    DATA = "data"
    EXIST = "exist"
    CHILD = "child"


class Arming(NamedTuple):
    """A watch asked for by a request, registered when its reply is read.

    :ivar path: the server's path (with the chroot)
    :ivar kind: DATA or CHILD (an ``exists`` answered "no node" arms EXIST instead)
    """

    path: str
    kind: Kind
    callback: WatchCallback


class Watcher:
    """A watch callback to wait on: ``await watcher.wait()`` returns the event.

    Example::

        watcher = Watcher()
        await zk.get_data("/config", watch=watcher)
        event = await watcher.wait()  # CHANGED, DELETED, or NONE if the session ended
    """

    __slots__ = ("_fired", "event")

    def __init__(self) -> None:
        self._fired = anyio.Event()
        #: The event, once fired.
        self.event: WatchedEvent | None = None

    def __call__(self, event: WatchedEvent, /) -> None:
        if self.event is None:
            self.event = event
            self._fired.set()

    async def wait(self) -> WatchedEvent:
        """Wait for the event. A checkpoint; cancelling it leaves the watch armed."""
        await self._fired.wait()
        return self.event


class Watches:
    """The armed watches of one session.

    :param unchroot: turns a server path into the caller's (strips the chroot)
    """

    def __init__(self, unchroot: Callable[[str], str]) -> None:
        self._unchroot = unchroot
        # kind -> path -> its callback, or a dict of them (in order) when there are
        # several: a path mostly has one (coord passes one callable per kind), and ten
        # thousand paths are watched at a time.
        self._tables: dict[Kind, dict[str, _Callbacks]] = {k: {} for k in Kind}

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables.values())

    def arm(self, arming: Arming, *, exists: bool = True) -> None:
        """Register the watch of a request just answered (*exists*: whether the node
        was there; an ``exists`` watch on a missing node is an EXIST watch)."""
        kind = arming.kind if exists else Kind.EXIST
        table, callback = self._tables[kind], arming.callback
        present = table.get(arming.path)
        if present is None:
            table[arming.path] = callback
        elif isinstance(present, dict):
            present[callback] = None
        elif present != callback:
            table[arming.path] = {present: None, callback: None}

    def armed(self, kind: Kind, path: str, callback: WatchCallback) -> bool:
        """Whether a watch of *kind* on *path* with *callback* is armed and has not fired."""
        present = self._tables[kind].get(path)
        return present is not None and (
            callback in present if isinstance(present, dict) else present == callback
        )

    def paths(self) -> tuple[list[str], list[str], list[str]]:
        """The watched paths, by kind (data, exist, child), for SetWatches."""
        return tuple(list(self._tables[k]) for k in Kind)  # type: ignore[return-value]

    def fire(self, event_type: int, path: str) -> None:
        """Fire (and forget) the watches a server event of *event_type* on *path*
        triggers, as the Java client does."""
        if event_type in (_CREATED, _CHANGED):
            kinds: tuple[Kind, ...] = (Kind.DATA, Kind.EXIST)
        elif event_type == _DELETED:
            kinds = (Kind.DATA, Kind.EXIST, Kind.CHILD)
        elif event_type == _CHILD:
            kinds = (Kind.CHILD,)
        else:  # watch-removed events and later kinds: nothing of ours
            return
        callbacks: dict[WatchCallback, None] = {}
        for kind in kinds:
            callbacks.update(_each(self._tables[kind].pop(path, None)))
        event = WatchedEvent(_EVENT_TYPES[event_type], KeeperState.CONNECTED, self._unchroot(path))
        for callback in callbacks:
            _call(callback, event)

    def fire_all(self, state: str) -> None:
        """Fire every watch with an event of type NONE in *state* (the session ended:
        the watches will never fire otherwise); the event's path is the watched one."""
        tables = self._tables
        self._tables = {k: {} for k in Kind}
        for table in tables.values():
            for path, callbacks in table.items():
                event = WatchedEvent(EventType.NONE, state, self._unchroot(path))
                for callback in _each(callbacks):
                    _call(callback, event)


_Callbacks = Union["WatchCallback", "dict[WatchCallback, None]"]


def _each(present: _Callbacks | None) -> dict[WatchCallback, None]:
    """The callbacks of one path, as an ordered set."""
    if present is None:
        return {}
    return present if isinstance(present, dict) else {present: None}


def _call(callback: WatchCallback, event: WatchedEvent) -> None:
    try:
        callback(event)
    except Exception:  # one broken callback must not take the connection down
        log.exception("a ZooKeeper watch callback failed (%r)", event)
