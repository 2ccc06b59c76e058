"""Waiter entries read with a data watch, kept until the watch fires.

A busy queue's lookers read its head again and again (``entries(prefix, limit=128,
stale_ok=True)``): on ZooKeeper one listing, then a read of each of the first 128 nodes,
mostly unchanged since the last look (10 reads a job at 8 workers). A read made with a
data watch stays true until that watch fires, so it is kept here and not read again:
the next look reads only the nodes it has not seen, or that changed.

Why a kept entry is as fresh as a read made with the listing: ZooKeeper sends a session
the event of a watch before the answer to any request it handles after the change, and
the wire client hands both over in that order, from its one reader, with no checkpoint
between (``_wire/_replies.py``). So when the listing's answer is read, every entry that
changed before the listing was served has been dropped here. A listener is added before
its read is sent (CURATOR-527), and an entry is kept only if its listener has not fired
since: a change between the read's answer and the caller's next step drops it.

A disconnect, a session's end or a replaced client wakes every listener
(``WatchRegistry.wake_all``): everything is dropped. Only the nodes of each queue's
last look are kept (:meth:`EntryCache.retain`), with their listeners, and at most
:data:`MAX_BYTES` of values in all; their server watches stay armed until they fire, as
any watch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ...abc import Entry
    from ._watches import WatchRegistry

__all__ = ["MAX_BYTES", "EntryCache"]

#: Values kept at most, in all (an entry that would pass it is read each time).
MAX_BYTES = 4 << 20


class EntryCache:
    """Entries by path, each kept while the data watch of its read has not fired."""

    def __init__(self, watches: WatchRegistry) -> None:
        self._watches = watches
        self._entries: dict[str, Entry] = {}
        self._armed: dict[str, Callable[[], None]] = {}  # path -> its listener
        self._bytes = 0  # of the values kept

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, path: str) -> Entry | None:
        """The entry kept for *path*, or None."""
        return self._entries.get(path)

    def arm(self, path: str) -> Callable[[], None]:
        """Listen for *path*'s data watch, before a read that arms it is sent: the token
        to :meth:`keep` its entry with. Not a checkpoint."""
        listener = self._armed.get(path)
        if listener is None:

            def listener() -> None:
                self._drop(path)

            self._armed[path] = listener
            self._watches.add("data", path, listener)
        return listener

    def keep(self, path: str, entry: Entry, token: Callable[[], None]) -> None:
        """Keep *entry*, read with a data watch after :meth:`arm` gave *token*, unless the
        watch fired since (then a later read tells)."""
        if self._armed.get(path) is not token or self._bytes + len(entry.value) > MAX_BYTES:
            return
        old = self._entries.get(path)
        self._bytes += len(entry.value) - (len(old.value) if old is not None else 0)
        self._entries[path] = entry

    def retain(self, node: str, paths: Iterable[str]) -> None:
        """Keep, of the entries under *node* (a queue's node), only those of *paths*
        (its last look), and stop listening for the others."""
        wanted = set(paths)
        under = node.rstrip("/") + "/"
        for path in [p for p in self._armed if p.startswith(under) and p not in wanted]:
            self._drop(path)

    def _drop(self, path: str) -> None:
        old = self._entries.pop(path, None)
        if old is not None:
            self._bytes -= len(old.value)
        listener = self._armed.pop(path, None)
        if listener is not None:
            self._watches.discard("data", path, listener)
