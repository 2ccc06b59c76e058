"""A turn in kazoo's or Curator's layout, written against :class:`coord.abc.Backend` only.

The loop of kazoo's ``Lock._inner_acquire`` and Curator's ``LockInternals
.internalLockLoop``: create my ephemeral sequential node under the lock's node (its name
from :mod:`coord._locks.node_layouts`, a GUID fresh per attempt), list the children, and
until the layout's rule says my turn has come, wait for the deletion of the one node it
names, and list again. Each listing also checks that my node still exists (kazoo raises
``ForceRetryError``, Curator ``NoNodeException``; here the hold is lost and the waiter
makes a new node). Beyond the peers: a loss cancels the wait or the body (the
:class:`NodeHold` watches the node and the session), a cancelled wait leaves no node
(the create runs in a task of the session, which deletes what it made for a caller that
went), a waiter whose session is lost waits again on the next one, and nothing is granted
while the connection is interrupted (Curator's SUSPENDED).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, TypeVar

from .._core import retry as _retry
from .._core.exceptions import BackendUnavailable, LockedError, SessionExpiredError
from .._sessions.identity import Waiter
from ..abc import Entry, Position
from .hold import Hold
from .node_layouts import LAYOUTS
from .peer_turn import retried, turn_on_sessions

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._sessions.session import Session, SessionSource
    from ..abc import Backend
    from .node_layouts import Side

__all__ = ["NodeHold", "create_node", "node_contenders", "node_turn", "node_waiters"]

H = TypeVar("H", bound="NodeHold")


class NodeHold(Hold):
    """A hold in kazoo's or Curator's layout: its fence is its node's czxid as the
    store has it (what a peer reads in the node's stat)."""

    _fence_of = staticmethod(lambda revision, seq=0: revision)


async def node_turn(
    source: SessionSource,
    name: str,
    prefix: str,
    side: Side,
    *,
    value: Callable[[], bytes],
    hold_type: type[H],
    wait: bool,
) -> H:
    """Create my node for *side* and wait for its turn (``wait=False``: take it only if
    it has come, else delete it and raise LockedError); return the granted hold.

    A checkpoint. If cancelled, nothing is held and the node is deleted by a task of the
    session.

    :raises LockedError: with ``wait=False``, if it is not my turn
    :raises SessionExpiredError: if the session is lost and none follows
    """
    if not wait:
        return await _try(await source.live(), name, prefix, side, value, hold_type)

    async def make(session: Session) -> Entry:
        return await create_node(session, prefix, side, value)

    async def until(session: Session, hold: Hold, entry: Entry) -> None:
        await _until_turn(session, hold, prefix, side, entry)

    return await turn_on_sessions(source, name, hold_type, make, until)


async def create_node(
    session: Session, prefix: str, side: Side, value: Callable[[], bytes]
) -> Entry:
    """My node, made in a task of the session (``settle``): if this caller goes before
    the answer, the node it made, or one a lost reply may have made (found by its GUID),
    is deleted then. A create with no answer is tried again under a new GUID while the
    session lives."""
    backend, lease = session.backend, session.lease
    for attempt in _retry.attempts():
        node = side.node_name()
        provisional = Entry(prefix + node, lease=lease.id)  # what a lost reply made

        def undo(made: Entry | None, provisional: Entry = provisional) -> None:
            session.discard(made or provisional)

        create = partial(
            backend.create_sequential,
            prefix,
            node,
            lease,
            value=value(),
            containers=LAYOUTS[side.layout],
        )
        try:
            entry = await session.settle(create, undo=undo, shield=False)
        except BackendUnavailable:
            entry = None
            session.discard(provisional)
        if entry is not None:
            return entry
        if session.lost:
            raise SessionExpiredError(f"the session was lost ({session.reason})")
        await _retry.backoff(attempt)
    raise AssertionError("unreachable")  # pragma: no cover


async def _until_turn(session: Session, hold: Hold, prefix: str, side: Side, mine: Entry) -> None:
    """List; wait for the node the rule names; again, until it names none (and the
    lease is not interrupted). :exc:`EntryGoneError` if my node is not listed."""
    backend = session.backend
    node = mine.key[len(prefix) :]
    while True:
        children = await retried(session, partial(backend.child_names, prefix))
        blocker = side.blocker(children.names, node)
        if blocker is None and not session.lease.interrupted:
            return
        hold._waited = True
        if blocker is None:
            await session.lease.wait_resumed()
            continue
        gone = partial(backend.wait_deleted, [prefix + blocker], revision=children.revision)
        await retried(session, gone)


async def _try(
    session: Session,
    name: str,
    prefix: str,
    side: Side,
    value: Callable[[], bytes],
    hold_type: type[H],
) -> H:
    """Kazoo's ``acquire(blocking=False)``: my node; unless its turn has come, it is
    deleted again."""
    entry = await create_node(session, prefix, side, value)
    try:
        children = await session.backend.child_names(prefix)
        blocker = side.blocker(children.names, entry.key[len(prefix) :])
    except BaseException:
        session.discard(entry)
        raise
    if blocker is not None or session.lease.interrupted:
        await session.delete(entry)
        raise LockedError(f"{name!r} is taken")
    hold = hold_type(name, session, Position(entry, (), children.revision))
    hold._grant()
    return hold


async def node_contenders(
    backend: Backend, prefix: str, side: Side, *, limit: int | None = None
) -> tuple[list[tuple[Entry, bool]], int]:
    """The contenders of *side*'s queue in its order (kazoo's ``contenders()``,
    Curator's ``getParticipantNodes``), each with whether it holds, and the revision of
    the listing; at most *limit* of them. A contender gone before its read is left out.
    A checkpoint; one listing, one read per contender."""
    children = await backend.child_names(prefix)
    found: list[tuple[Entry, bool]] = []
    for child in side.order(children.names):
        if limit is not None and len(found) >= limit:
            break
        entry = await backend.get(prefix + child)
        if entry is not None:
            holding = side.side_of(child).blocker(children.names, child) is None
            found.append((entry, holding))
    return found, children.revision


async def node_waiters(backend: Backend, *, prefix: str, side: Side) -> list[Waiter]:
    """:meth:`coord.Mutex.waiters` in kazoo's or Curator's layout (fence: the czxid)."""
    found, _ = await node_contenders(backend, prefix, side)
    return [Waiter._of(entry, holding, raw_fence=True) for entry, holding in found]
