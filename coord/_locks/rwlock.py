"""RWLock: a fair read-write lock — many readers or one writer, in arrival order.

Readers and writers queue under one name (:mod:`coord._locks.wait_queue`), their waiter ids marked
``@r`` and ``@w``. A reader waits only for the nearest *writer* ahead of it (one read of
the store finds it: the backends can select entries by kind); a writer waits for the
nearest entry of any kind ahead of it. So readers that arrive together hold together, a
writer waits for the readers before it and no reader after it, and a writer is never
starved by a stream of later readers: they queue behind it. (kazoo's ReadLock counted the
writers *behind* a reader: a deadlock, kazoo #649.)
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from .._core import keys as _keys
from .task_lock import TaskLock
from .wait_queue import EXCLUSIVE, Rule

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._sessions.session import SessionSource
    from ..abc import Entry

__all__ = ["RWLock", "RWLockSide"]

_READER = _keys.WAITER_MARK + "r"
_WRITER = _keys.EXCLUSIVE_MARK  # also every other recipe's entries (see _keys)


_READ_RULE = Rule(kind=_WRITER)  # a reader counts only the writers ahead of it


class RWLockSide(TaskLock):
    """One side of a :class:`coord.RWLock`: ``rw.read`` or ``rw.write``.

    Used like a :class:`coord.Mutex`: ``async with rw.read as hold:``, ``acquire``,
    ``try_acquire``, ``release``, ``locked``, ``waiters``, ``holders``; a loss raises
    :exc:`coord.LockLost`. The read side is shared with other readers, the write side
    is not.
    """

    _mark = ""

    def _rule_for(self, entry: Entry) -> Rule:
        reader = _keys.waiter_id_of(entry.key).startswith(_READER)
        return _READ_RULE if reader else EXCLUSIVE

    def __repr__(self) -> str:
        return f"<coord.RWLock {self._name!r} {self._what} held here={len(self._held())}>"

    def _waiter_id(self) -> Callable[[], str]:
        mark = self._mark
        return lambda: f"{mark}{uuid.uuid4().hex}"


class _Read(RWLockSide):
    _what = "read lock"
    _kind = "read"
    _mark = _READER
    # Only writers count: my turn comes when no writer is ahead of me.
    _rule = _READ_RULE


class _Write(RWLockSide):
    _what = "write lock"
    _kind = "write"
    _mark = _WRITER


class RWLock:
    """A distributed read-write lock: ``async with rw.read:`` / ``async with rw.write:``.

    Example::

        rw = client.rwlock("config")
        async with rw.read as hold:        # shared with other readers
            config = await load(fence=hold.fence)
        async with rw.write as hold:       # alone
            await save(config, fence=hold.fence)

    Fair: readers and writers are served in arrival order; readers that arrive together
    hold together. Each side behaves like :class:`coord.Mutex` (``acquire``,
    ``try_acquire``, ``release``, loss raises :exc:`coord.LockLost`). A task holds one
    side at a time: asking for the other (or the same) side again raises
    :exc:`coord.LockedError`, since it would wait on itself.

    **The kazoo and Curator layouts** (``layout="kazoo"`` or ``"curator"``, on
    ZooKeeper): the nodes of kazoo's ``ReadLock``/``WriteLock`` (``__rlock__``/``__lock__``,
    ``kazoo/recipe/lock.py``) or of Curator's ``InterProcessReadWriteLock``
    (``__READ__``/``__WRIT__``, ``InterProcessReadWriteLock.java``), with the peer's rule:
    a kazoo reader waits for the nearest writer ahead, a Curator reader for the first
    one; a writer for the node right ahead. Curator's reentrancy (a writer taking the
    read side) is not offered: a task holds one side at a time.

    :param session: where the waiter keys' lease comes from
    :param name: slash-separated name
    :param layout: ``"coord"`` (the default), ``"kazoo"`` or ``"curator"``
    :raises ConfigurationError: for a layout without a read-write lock (``"etcd"``) or
        one the store does not speak
    :ivar read: the read side, shared with other readers
    :ivar write: the write side, held alone
    """

    read: RWLockSide
    write: RWLockSide

    def __init__(self, session: SessionSource, name: str, *, layout: str = "coord") -> None:
        self._name = _keys.check_name(name)
        self.read = _Read(session, name, layout=layout)
        self.write = _Write(session, name, layout=layout)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<coord.RWLock {self._name!r}>"
