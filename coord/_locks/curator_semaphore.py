"""A lease of Curator's ``InterProcessSemaphoreV2``, written against :class:`coord.abc.Backend`.

The protocol of apache/curator 5.4 ``curator-recipes/src/main/java/org/apache/curator/
framework/recipes/locks/InterProcessSemaphoreV2.java`` (``internalAcquire1Lease``): under
the semaphore's path, an ``InterProcessMutex`` at ``locks`` (Curator's mutex, taken here
by :func:`~coord._locks.node_turn.node_turn`) guards the making of leases. Its holder
creates its lease, a protected ephemeral sequential node ``leases/_c_<uuid>-lease-<seq>``
(``creatingParentContainersIfNeeded``: the parents are containers), lists ``leases`` with
a watch, and holds once the children number at most ``maxLeases``, its own included;
otherwise it waits for the children to change and counts again. Then it releases the
mutex. Its own node missing from a listing (a lost session) means starting over
(``RETRY_DUE_TO_MISSING_NODE``); closing the lease deletes the node.

So the mutex's queue is the order (FIFO), and only its holder waits among the leases. It
counts, it does not sort: any lease that goes frees a slot (the oldest or not), and while
the leases number more than the limit (a peer with a larger limit, a dead session not yet
expired) the waiter goes on waiting.

Beyond Curator: a cancelled acquire leaves neither node (each is deleted by a task of the
session), a waiter whose session is lost starts over on the next one, nothing is granted
while the connection is interrupted, and a held lease is a
:class:`~coord._locks.node_turn.NodeHold` (fence: the lease node's czxid; a loss cancels
the body).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

from .._core.exceptions import EntryGoneError, LockedError, SessionExpiredError
from .._sessions.identity import Waiter, parse_identity
from ..abc import Position
from .node_layouts import CURATOR_LEASE, layout_side
from .node_turn import NodeHold, create_node, node_contenders, node_turn
from .peer_turn import queue_on, retried

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._sessions.session import Session, SessionSource
    from ..abc import Backend, Entry
    from .hold import Hold

__all__ = ["LEASES", "LOCKS", "lease_contenders", "lease_turn", "lease_waiters"]

H = TypeVar("H", bound=NodeHold)

#: InterProcessSemaphoreV2's ``LOCK_PARENT`` and ``LEASE_PARENT``.
LOCKS, LEASES = "locks/", "leases/"
_MUTEX = layout_side("curator", "mutex")


async def lease_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    limit: int,
    *,
    value: Callable[[], bytes],
    hold_type: type[H],
    wait: bool,
) -> H:
    """Take the ``locks`` mutex, make my lease and wait until the leases number at most
    *limit*, then release the mutex; return the lease's hold. ``wait=False`` (Curator's
    ``acquire(0, unit)``): only if the mutex is free and the lease holds at once.

    A checkpoint. If cancelled, nothing is held, and both nodes are deleted by tasks of
    the session.

    :raises LockedError: with ``wait=False``, if no lease is free now
    :raises SessionExpiredError: if the session is lost and none follows
    """
    while True:
        lock = await node_turn(
            source, name, prefix + LOCKS, _MUTEX, value=value, hold_type=NodeHold, wait=wait
        )
        session = lock.session
        lock._finish()  # (Curator ignores the mutex once it holds it; so does this)
        hold: H | None
        try:
            if wait:
                hold = await _lease(session, name, prefix + LEASES, limit, value, hold_type)
            else:
                hold = await _try_lease(session, name, prefix + LEASES, limit, value, hold_type)
        except BaseException:
            session.discard(lock.entry)
            raise
        try:
            await session.delete(lock.entry)  # the mutex's release, after the lease
        except BaseException:
            if hold is not None:
                hold._finish()
                session.discard(hold.entry)
            raise
        if hold is not None:
            return hold
        if not source.renews:
            raise SessionExpiredError(f"my lease of {name!r} went while waiting ({session.reason})")


async def _lease(
    session: Session,
    name: str,
    leases: str,
    limit: int,
    value: Callable[[], bytes],
    hold_type: type[H],
) -> H | None:
    """My lease on *session*, once it holds; None if it or the session went meanwhile."""

    async def make(session: Session) -> Entry:
        return await create_node(session, leases, CURATOR_LEASE, value)

    async def until(session: Session, hold: Hold, mine: Entry) -> None:
        await _until_leased(session, hold, leases, limit, mine)

    return await queue_on(session, name, hold_type, make, until)


async def _until_leased(session: Session, hold: Hold, leases: str, limit: int, mine: Entry) -> None:
    """List the leases; while they number more than *limit*, wait for a change of the
    children (the watch of Curator's ``getChildren().usingWatcher``) and list again.
    :exc:`EntryGoneError` if my node is not listed."""
    backend = session.backend
    node = mine.key[len(leases) :]
    while True:
        children = await retried(session, partial(backend.child_names, leases))
        if node not in children.names:
            raise EntryGoneError(f"{mine.key} is not among the leases any more")
        over = len(children.names) > limit  # every child counts, as in Curator
        if not over and not session.lease.interrupted:
            return
        hold._waited = True
        if not over:
            await session.lease.wait_resumed()
            continue
        changed = partial(backend.wait_keys_changed, leases, revision=children.revision)
        await retried(session, changed)


async def _try_lease(
    session: Session,
    name: str,
    leases: str,
    limit: int,
    value: Callable[[], bytes],
    hold_type: type[H],
) -> H:
    """My lease if it holds at once; else it is deleted again and LockedError raised."""
    entry = await create_node(session, leases, CURATOR_LEASE, value)
    try:
        children = await session.backend.child_names(leases)
    except BaseException:
        session.discard(entry)
        raise
    if entry.key[len(leases) :] not in children.names:
        raise SessionExpiredError(f"my lease of {name!r} went at once ({session.reason})")
    if len(children.names) > limit or session.lease.interrupted:
        await session.delete(entry)
        raise LockedError(f"{name!r}: all {limit} leases are taken")
    hold = hold_type(name, session, Position(entry, (), children.revision))
    hold._grant()
    return hold


async def lease_contenders(
    backend: Backend, *, prefix: str, limit: int | None
) -> tuple[list[tuple[Entry, bool]], int | None]:
    """The leases in creation order, then the contenders queued on the ``locks`` mutex,
    each with whether it holds; and the limit counted by.

    All leases hold but the newest, which waits if they number more than the limit
    (*limit*; None: the largest that coord's lease nodes record; if none does, the
    newest waits if the ``locks`` mutex's holder is of its session and older: it made
    that lease and waits on it). A snapshot: a contender between its grant and its
    release of the mutex shows as a waiter. A checkpoint; one listing per node, one read
    per node listed.
    """
    children = await backend.child_names(prefix + LEASES)
    leases = [
        entry
        for child in CURATOR_LEASE.order(children.names)
        if (entry := await backend.get(prefix + LEASES + child)) is not None
    ]
    if limit is None:
        limits = [parse_identity(e.value).get("limit") for e in leases]
        limit = max((n for n in limits if isinstance(n, int)), default=None)
    queued, _ = await node_contenders(backend, prefix + LOCKS, _MUTEX)
    head = queued[0][0] if queued else None
    if limit is not None:
        waits = len(children.names) > limit
    else:
        waits = head is not None and bool(leases) and _made_by(leases[-1], head)
    found = [(e, not (waits and e is leases[-1])) for e in leases]
    if waits:
        queued = queued[1:]  # the mutex's holder is the lease that waits
    return found + [(entry, False) for entry, _ in queued], limit


async def lease_waiters(backend: Backend, *, prefix: str, limit: int) -> list[Waiter]:
    """:meth:`coord.Semaphore.waiters` in Curator's layout (fence: the czxid)."""
    found, _ = await lease_contenders(backend, prefix=prefix, limit=limit)
    return [Waiter._of(entry, holding, raw_fence=True) for entry, holding in found]


def _made_by(lease: Entry, lock: Entry) -> bool:
    """Whether *lease* is of the session that holds the ``locks`` mutex, made after it."""
    return lease.lease == lock.lease and lease.revision > lock.revision
