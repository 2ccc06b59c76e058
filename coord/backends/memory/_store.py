"""The in-process store behind ``memory://``: keys with revisions, leases, watches.

The "server" side of :mod:`coord.backends.memory`, with etcd's data model: every change
bumps one revision counter; a key remembers its create and mod revisions and its lease;
a watch can start from a past revision (recent changes are kept).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from ..._core.exceptions import SessionExpiredError
from ..._core.keys import WAITER_MARK
from ...abc import Change, ChangeKind, Check, Create, Entry, Position, Put, Update

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from anyio.streams.memory import MemoryObjectSendStream

    from ...abc import Op

__all__ = ["MemoryStore"]


@dataclass
class _LeaseRecord:
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)
    refreshed: anyio.Event = field(default_factory=anyio.Event)


class MemoryStore:
    """The "server": keys with revisions, leases, watches. One per ``memory://`` name."""

    _registry: dict[str, MemoryStore] = {}  # noqa: RUF012  (process-wide, by design)

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.revision: int = 1
        self._kv: dict[str, Entry] = {}
        self._leases: dict[int, _LeaseRecord] = {}
        self._lease_ids = itertools.count(0x1000)
        #: What to call when a key is deleted (its waiters' ``Event.set``, guards).
        self._deleted: dict[str, list[Callable[[], None]]] = {}
        self._changed: dict[str, list[anyio.Event]] = {}
        self._watchers: list[tuple[str, MemoryObjectSendStream[Change]]] = []
        # Recent changes, so that a watch can start from a past revision like on etcd.
        self._history: deque[Change] = deque(maxlen=10_000)
        #: The revision of the newest change no longer kept (a watch from before it
        #: raises ResyncNeeded, like a watch from a compacted revision on etcd).
        self.compacted: int = 0
        self._users = 0
        #: Statistics for tests: how many delete notifications were delivered.
        self.wakeups: int = 0

    # -- registry -------------------------------------------------------------------------

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The shared store called *name*, created if needed."""
        store = cls._registry.get(name)
        if store is None:
            store = cls._registry[name] = cls(name)
        return store

    def _attach(self) -> None:
        self._users += 1

    def _detach(self) -> None:
        self._users -= 1
        if self._users == 0 and self._registry.get(self.name) is self:
            del self._registry[self.name]

    # -- fault hooks ----------------------------------------------------------------------

    def expire_lease(self, lease_id: int) -> None:
        """Expire lease *lease_id* now, deleting every key bound to it."""
        record = self._leases.pop(lease_id, None)
        if record is not None:
            for key in sorted(record.keys):
                self._delete_key(key)

    def drop_key(self, key: str) -> bool:
        """Delete *key* as another client would. Returns whether it existed."""
        return self._delete_key(key)

    def keys(self, prefix: str = "") -> list[str]:
        """Every live key under *prefix* (for assertions in tests)."""
        return sorted(k for k in self._kv if k.startswith(prefix))

    # -- the data model -------------------------------------------------------------------

    def _next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def _apply(self, ops: Sequence[Op]) -> tuple[Entry | None, ...]:
        """Apply a checked transaction at one new revision (like an etcd txn)."""
        rev = self._next_revision()
        results: list[Entry | None] = []
        for op in ops:
            if isinstance(op, Create):
                lease = op.lease.id if op.lease is not None else 0
                results.append(self._put(op.prefix + op.waiter_id, op.value, lease, rev=rev))
            elif isinstance(op, Update):
                results.append(self._put(op.entry.key, op.value, op.entry.lease, rev=rev))
            elif isinstance(op, Put):
                old = self._kv.get(op.key)
                self._put(op.key, op.value, old.lease if old else 0, rev=rev)
                results.append(None)
            elif isinstance(op, Check):
                results.append(None)
            else:
                self._delete_key(op.entry.key, rev=rev)
                results.append(None)
        return tuple(results)

    def _put(self, key: str, value: bytes, lease: int, *, rev: int = 0) -> Entry:
        if lease and lease not in self._leases:
            raise SessionExpiredError(f"lease {lease:x} not found")
        old = self._kv.get(key)
        if old is not None and old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        rev = rev or self._next_revision()
        entry = Entry(key, value, old.revision if old else rev, rev, lease)
        self._kv[key] = entry
        if lease:
            self._leases[lease].keys.add(key)
        for event in self._changed.pop(key, ()):
            event.set()
        self._notify(Change(ChangeKind.PUT, entry, rev))
        return entry

    def _delete_key(self, key: str, *, rev: int = 0) -> bool:
        entry = self._kv.pop(key, None)
        if entry is None:
            return False
        if entry.lease in self._leases:
            self._leases[entry.lease].keys.discard(key)
        rev = rev or self._next_revision()
        for wake in self._deleted.pop(key, ()):
            self.wakeups += 1
            wake()
        for event in self._changed.pop(key, ()):
            event.set()
        self._notify(Change(ChangeKind.DELETE, Entry(key), rev))
        return True

    def _notify(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self.compacted = self._history[0].revision
        self._history.append(change)
        for prefix, stream in list(self._watchers):
            if change.entry.key.startswith(prefix):
                try:
                    stream.send_nowait(change)
                except anyio.WouldBlock:  # a watcher that does not keep up is dropped
                    stream.close()
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass

    def _queue(self, prefix: str, kind: str | None = None) -> list[Entry]:
        mark = prefix + (kind or WAITER_MARK)
        waiters = [
            e for k, e in self._kv.items() if k.startswith(mark) and "/" not in k[len(mark) :]
        ]
        return sorted(waiters, key=lambda e: e.revision)

    def _position(
        self, entry: Entry, prefix: str, ahead: int | None, kind: str | None = None
    ) -> Position:
        before = [e for e in self._queue(prefix, kind) if e.revision < entry.revision]
        before.reverse()
        return Position(
            entry, tuple(before[:ahead] if ahead is not None else before), self.revision
        )
