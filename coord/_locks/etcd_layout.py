"""The etcd layout: a mutex or a candidacy as etcd's Go ``client/v3/concurrency`` has it.

So that ``etcdctl lock``, ``etcdctl elect`` and Go services share a lock or an election
with coord, in both directions. The layout and protocol, as read in etcd-io/etcd
``client/v3/concurrency/mutex.go`` (``Lock``, ``tryAcquire``, ``TryLock``), ``key.go``
(``waitDeletes``), ``election.go`` (``Campaign``, ``Resign``) and ``session.go``:

* one key per *session*: ``<name>/<lease id in lowercase hex, unpadded>``, bound to the
  lease, created only if its create revision is 0 (a transaction);
* the holder (the leader) is the key of lowest create revision under ``<name>/``;
* a waiter reads the newest key created before its own (``max_create_revision`` = mine
  - 1), waits for the deletion of that one key only, and reads again, until none is
  left; then (etcd 3.5's ``Lock``) checks that its own key still exists;
* the release (resign) deletes the key only if its create revision is still mine.

What the layout gives up: one key per session means one holder or waiter per client and
name, so this client's tasks queue *locally*, in FIFO order, in front of the one key
(:class:`_LocalQueue`), and a hold's fence is the key's create revision itself (as a Go
holder reads it). Written against :class:`coord.abc.Backend` only (its
``keys_by_creation``, ``wait_deleted``, ``compare_and_set``, guarded ``delete``); the
hold (:class:`~coord._locks.hold.Hold`) watches the key and the session as for coord's
layout, so a loss cancels the body, and a cancelled wait leaves no key.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._core.exceptions import BackendError, BackendUnavailable, LockedError
from ..abc import Position
from .hold import Hold
from .peer_turn import retried, turn_on_sessions

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._sessions.session import Session, SessionSource
    from ..abc import Entry

__all__ = ["EtcdHold", "etcd_key", "etcd_turn"]

H = TypeVar("H", bound="EtcdHold")


def etcd_key(prefix: str, lease_id: int) -> str:
    """The key of a session's waiter or candidate: ``fmt.Sprintf("%s%x", pfx, lease)``
    in mutex.go and election.go (lowercase hex, no padding)."""
    return f"{prefix}{lease_id:x}"


class _LocalQueue:
    """This client's tasks on one name, queued in front of its one key (anyio's Lock is
    FIFO); *users* counts holders and waiters, so that an unused name leaves nothing."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.users = 0


_queues: weakref.WeakKeyDictionary[SessionSource, dict[str, _LocalQueue]] = (
    weakref.WeakKeyDictionary()
)


def _enter(source: SessionSource, prefix: str) -> _LocalQueue:
    queues = _queues.setdefault(source, {})
    local = queues.get(prefix) or queues.setdefault(prefix, _LocalQueue())
    local.users += 1
    return local


def _leave(source: SessionSource, prefix: str, local: _LocalQueue, *, owned: bool) -> None:
    if owned:
        local.lock.release()
    local.users -= 1
    if not local.users:
        _queues.get(source, {}).pop(prefix, None)


class EtcdHold(Hold):
    """A hold of the etcd layout: its fence is the key's create revision (what Go's
    ``Mutex.Key()`` holder and ``etcdctl lock``'s ``ETCD_LOCK_REV`` compare to), and its
    end lets the next task of this client in (see :class:`_LocalQueue`)."""

    _fence_of = staticmethod(lambda revision, seq=0: revision)
    _local: tuple[SessionSource, str, _LocalQueue] | None = None

    async def _end(self) -> None:
        try:
            await super()._end()
        finally:
            local, self._local = self._local, None
            if local is not None:
                _leave(*local, owned=True)


async def etcd_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    *,
    value: Callable[[], bytes],
    hold_type: type[H],
    wait: bool,
) -> H:
    """Queue locally, then take the one key of this client's session for *name* as Go's
    ``Mutex.Lock`` (``wait=False``: ``TryLock``) does; return the granted hold.

    A checkpoint. If cancelled, nothing is held, the key is deleted by a task of the
    session and the next local task goes on.

    :raises LockedError: with ``wait=False``, if another holds it (here or elsewhere)
    :raises SessionExpiredError: if the session is lost and none follows
    """
    local = _enter(source, prefix)
    try:
        if wait:
            await local.lock.acquire()
        else:
            try:
                local.lock.acquire_nowait()
            except anyio.WouldBlock:
                raise LockedError(f"{name!r} is taken (by a task of this client)") from None
    except BaseException:
        _leave(source, prefix, local, owned=False)
        raise
    try:
        take = _wait_turn if wait else _try_turn
        hold = await take(source, name, prefix, value, hold_type)
    except BaseException:
        _leave(source, prefix, local, owned=True)
        raise
    hold._local = (source, prefix, local)
    return hold


def _wait_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    value: Callable[[], bytes],
    hold_type: type[H],
) -> Awaitable[H]:
    async def make(session: Session) -> Entry:
        return await _create(session, etcd_key(prefix, session.lease.id), value())

    async def until(session: Session, hold: Hold, entry: Entry) -> None:
        await _wait_deletes(session, hold, prefix, entry)

    return turn_on_sessions(source, name, hold_type, make, until)


async def _create(session: Session, key: str, value: bytes) -> Entry:
    """My key, created bound to the lease only if absent (mutex.go ``tryAcquire``).

    The create runs in a task of the session (``settle``): if this caller goes away
    before its answer, the key it made is deleted then. A key of my lease found there
    is an earlier attempt's of this client (a cancelled one whose delete may be on its
    way, or one whose answer was lost): it is deleted, guarded by its create revision,
    and made anew, never taken over (Go reuses it; here a delete in flight would then
    take the new holder's key away).
    """
    backend, lease = session.backend, session.lease
    create = partial(backend.compare_and_set, key, value, version=None, lease=lease)

    def undo(made: Entry | None) -> None:
        if made is not None:
            session.discard(made)

    while True:
        try:
            entry = await session.settle(create, undo=undo, shield=False)
        except BackendUnavailable:
            entry = None  # unknown: read what is there
        if entry is not None:
            return entry
        found = await retried(session, partial(backend.get, key))
        if found is None:
            continue
        if found.lease != lease.id:
            raise BackendError(f"{key!r} exists, bound to another lease ({found.lease:x})")
        await retried(session, partial(backend.delete, found))


async def _wait_deletes(session: Session, hold: Hold, prefix: str, mine: Entry) -> None:
    """Until no key under *prefix* was created before mine (key.go ``waitDeletes``:
    the newest one before mine, its deletion, again), then check that mine still exists
    (mutex.go ``Lock`` since etcd 3.5; :exc:`EntryGoneError` if not)."""
    backend = session.backend
    before = partial(
        backend.keys_by_creation,
        prefix,
        limit=1,
        newest_first=True,
        created_before=mine.revision,
    )
    while True:
        listing = await retried(session, before)
        if not listing.entries:
            break
        hold._waited = True
        gone = partial(backend.wait_deleted, [listing.entries[0].key], revision=listing.revision)
        await retried(session, gone)
    if hold._waited:
        await retried(session, partial(backend.position, mine, ahead=0))


async def _try_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    value: Callable[[], bytes],
    hold_type: type[H],
) -> H:
    """mutex.go ``TryLock``: create my key; unless it is the oldest, delete it again."""
    session = await source.live()
    entry = await _create(session, etcd_key(prefix, session.lease.id), value())
    try:
        oldest = await session.backend.keys_by_creation(prefix, limit=1)
    except BaseException:
        session.discard(entry)
        raise
    if oldest.entries and oldest.entries[0].revision != entry.revision:
        await session.delete(entry)
        raise LockedError(f"{name!r} is taken")
    hold = hold_type(name, session, Position(entry, (), oldest.revision))
    hold._grant()
    return hold
