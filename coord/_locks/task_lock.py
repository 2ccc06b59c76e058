"""TaskLock: what Mutex, Semaphore and the two sides of RWLock share — a hold per task.

A lock recipe is held by a *task*: ``acquire`` in one task and ``release`` in another is
refused (trio's rule). One client keeps, per name, which of its tasks hold or wait, so
that a task asking again for a name it already holds — through the same object or another
one of the same client — gets a clear :exc:`coord.LockedError` instead of waiting on
itself forever; or, for a mutex made with ``reentrant=True``, enters again.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING

from anyio import get_current_task

from .._core import keys as _keys
from .._core.checks import check_bool, check_layout
from .._core.exceptions import ConfigurationError, LockedError, LockLost, NotOwnerError
from .._sessions.identity import Waiter, waiter_value
from .etcd_layout import EtcdHold, etcd_turn
from .hold import Hold
from .node_layouts import LAYOUTS as NODE_LAYOUTS
from .node_layouts import layout_side
from .node_turn import NodeHold, node_turn, node_waiters
from .wait_queue import EXCLUSIVE, Rule, try_turn, wait_turn

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from .._sessions.session import SessionSource
    from ..abc import Entry, Position
    from .node_layouts import Side

__all__ = ["TaskLock"]

_log = logging.getLogger("coord")


@dataclass
class _Claim:
    """One task's hold (or wait) on one name, through one client."""

    lock: TaskLock
    hold: Hold | None = None
    depth: int = 0
    #: One item per open ``async with`` of this task: whether it opened the body scope
    #: (the first one while no scope is open), so that the block that opened it closes
    #: it, however acquire() and release() are interleaved with the blocks.
    blocks: list[bool] = field(default_factory=list)
    #: When the hold was granted (``time.monotonic``: a fiftieth of the cost of anyio's
    #: clock, and real time even under a test's mock clock), for the hold time.
    granted_at: float = 0.0


# Per session source (one client), per (prefix, task id): the claim.
_claims: weakref.WeakKeyDictionary[SessionSource, dict[tuple[str, int], _Claim]] = (
    weakref.WeakKeyDictionary()
)


def _task_id() -> int:
    """anyio's id of the current task (``get_current_task().id``), without making its
    TaskInfo on asyncio: a lock asks it three times per acquire and release."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop: trio
        task = None
    return id(task) if task is not None else get_current_task().id


class TaskLock:
    """A recipe whose holds belong to tasks. Subclasses say what their turn is."""

    #: How the recipe calls itself in messages.
    _what = "lock"

    def __init__(
        self, source: SessionSource, name: str, *, reentrant: bool = False, layout: str = "coord"
    ) -> None:
        check_bool(reentrant, "reentrant")
        backend = source.backend
        self._layout = check_layout(layout, backend.layouts, type(backend).__name__)
        # The peer's side of this recipe (refused at the call if the peer has none).
        self._side = self._peer_side(layout) if layout in NODE_LAYOUTS else None
        if layout == "etcd" and self._kind not in ("mutex", "election"):
            raise ConfigurationError(f"the 'etcd' layout has no {self._kind} (use layout='coord')")
        self._source = source
        self._name = _keys.check_name(name)
        self._prefix = _keys.prefix_of(name)
        self._reentrant = reentrant
        self._waiting = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def layout(self) -> str:
        """The layout of its keys in the store: ``"coord"``, ``"etcd"`` (etcd's Go
        ``concurrency`` package), ``"kazoo"`` or ``"curator"`` (their recipes on
        ZooKeeper): see :class:`coord.Mutex`."""
        return self._layout

    def __repr__(self) -> str:
        return f"<coord.{type(self).__name__} {self._name!r} held here={len(self._held())}>"

    # -- what subclasses decide -----------------------------------------------------------

    _rule: Rule = EXCLUSIVE
    _hold_type: type[Hold] = Hold
    #: The hold of the etcd layout (:mod:`coord._locks.etcd_layout`).
    _etcd_hold_type: type[EtcdHold] = EtcdHold
    #: The hold of kazoo's and Curator's layouts (:mod:`coord._locks.node_turn`).
    _node_hold_type: type[NodeHold] = NodeHold
    #: Which of a peer layout's recipes it is (:func:`~.node_layouts.layout_side`).
    _kind = "mutex"
    #: Whether its acquires count in the client's statistics (not a queue's own turns).
    _counted = True
    #: Whether a hold lost by its release is logged at WARNING (not a queue's idle
    #: lookers' places, which a closing client's revoke takes before its looker leaves).
    _loss_warned = True

    def _peer_side(self, layout: str) -> Side:
        """The side of kazoo's or Curator's *layout* that this recipe is (ConfigurationError
        at the call if the peer has none)."""
        return layout_side(layout, self._kind)

    def _value(self) -> bytes:
        """The value of my waiter key: who I am (and what the recipe needs to record)."""
        return waiter_value(self._source.identity)

    def _rule_for(self, entry: Entry) -> Rule:
        """The rule of the recipe side that registered *entry* (a read-write lock's
        queue holds both kinds)."""
        return self._rule

    def _waiter_id(self) -> Callable[[], str] | None:
        return None

    def _check(self, position: Position) -> None:
        """Called with every position read while waiting; may raise."""

    # -- claims ---------------------------------------------------------------------------

    def _claims(self) -> dict[tuple[str, int], _Claim]:
        claims = _claims.get(self._source)
        if claims is None:
            claims = _claims[self._source] = {}
        return claims

    def _claim(self) -> _Claim | None:
        return self._claims().get((self._prefix, _task_id()))

    def _held(self) -> list[Hold]:
        return [
            c.hold
            for (prefix, _), c in self._claims().items()
            if prefix == self._prefix and c.lock is self and c.hold is not None
        ]

    async def waiters(self) -> list[Waiter]:
        """Everyone in the queue, in order: who holds, then who waits, with fences and
        identities (host, pid, client name). A checkpoint; one read of the store.

        :raises BackendUnavailable: if the store cannot be reached
        """
        if self._layout == "etcd":  # the oldest key holds (the Go layout's fence: raw)
            listing = await self._source.read(lambda b: b.keys_by_creation(self._prefix))
            return [Waiter._of(e, not i, raw_fence=True) for i, e in enumerate(listing.entries)]
        if self._side is not None:
            return await self._source.read(
                partial(node_waiters, prefix=self._prefix, side=self._side)
            )
        listing = await self._source.read(lambda b: b.entries(self._prefix))
        entries = listing.entries
        waiters = []
        for index, entry in enumerate(entries):
            rule = self._rule_for(entry)
            counted = [
                e
                for e in entries[:index]
                if rule.kind is None or _keys.waiter_id_of(e.key).startswith(rule.kind)
            ]
            waiters.append(Waiter._of(entry, len(counted) < rule.limit))
        return waiters

    async def holders(self) -> list[Waiter]:
        """The entries that hold now (see :meth:`waiters`). A checkpoint."""
        return [w for w in await self.waiters() if w.holding]

    def locked(self) -> bool:
        """Whether a task of this process holds it through this object. Local state only:
        says nothing of other processes. Not a checkpoint."""
        return bool(self._held())

    # -- acquire and release --------------------------------------------------------------

    def _enter_again(self) -> Hold | None:
        """The hold to enter again (reentrant), None if there is none; raises if the task
        would wait on itself."""
        claim = self._claim()
        if claim is None:
            return None
        if claim.hold is not None and self._reentrant and claim.lock._reentrant:
            claim.depth += 1
            return claim.hold
        how = "through this object" if claim.lock is self else f"through {claim.lock!r}"
        raise LockedError(
            f"this task already holds or waits for {self._name!r} ({how}): it would wait "
            f"on itself" + ("" if self._reentrant else " (use reentrant=True to enter again)")
        )

    async def acquire(self) -> Hold:
        """Wait for my turn in FIFO order and return the :class:`Hold`.

        A checkpoint. Waits through store outages and session losses (a waiter whose
        session is lost registers again on the next one). If cancelled, nothing is held
        and the waiter key is deleted by a task of the session (under anyio and native
        asyncio cancellation alike).

        :raises LockedError: if this task already holds or waits for this name through
            this client (unless re-entering a reentrant mutex)
        :raises SessionExpiredError: if the session is lost and no new one follows
        """
        return await self._take(wait=True)

    async def try_acquire(self) -> Hold:
        """Take it if it is free for me now, else raise at once.

        A checkpoint; one round trip, or two when it is taken (the key is removed).

        :raises LockedError: if it is taken
        :raises BackendUnavailable: if the store cannot be reached (nothing is left)
        """
        return await self._take(wait=False)

    async def _take(self, *, wait: bool) -> Hold:
        again = self._enter_again()
        if again is not None:
            return again
        claims = self._claims()
        key = (self._prefix, _task_id())
        claim = claims[key] = _Claim(self)
        self._waiting += 1
        started = monotonic()
        try:
            hold = await self._turn(wait=wait)
        except BaseException:
            claims.pop(key, None)
            raise
        finally:
            self._waiting -= 1
        claim.hold, claim.depth = hold, 1
        claim.granted_at = now = monotonic()
        if self._counted:
            self._source.counters.acquired(
                self._what, self._name, hold.fence, now - started, hold._waited
            )
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "%s %r acquired (fence %d) after %.3fs%s",
                self._what,
                self._name,
                hold.fence,
                now - started,
                " of waiting" if hold._waited else "",
            )
        return hold

    def _turn(self, *, wait: bool) -> Awaitable[Hold]:
        """Register a waiter key and wait for its turn (or, with ``wait=False``, take it
        only if it has come). Not a coroutine function: it returns the call's coroutine,
        so that a waiter keeps no frame of its own here (its memory is mostly frames)."""
        if self._side is not None:
            return node_turn(
                self._source,
                self._name,
                self._prefix,
                self._side,
                value=self._value,
                hold_type=self._node_hold_type,
                wait=wait,
            )
        if self._layout == "etcd":
            return etcd_turn(
                self._source,
                self._name,
                self._prefix,
                value=self._value,
                hold_type=self._etcd_hold_type,
                wait=wait,
            )
        turn = wait_turn if wait else try_turn
        return turn(
            self._source,
            self._name,
            self._prefix,
            self._rule,
            value=self._value,  # made anew at each registration (its time)
            waiter_id=self._waiter_id(),
            check=self._check,
            hold_type=self._hold_type,
        )

    async def release(self) -> None:
        """Release what the current task holds (the outermost release of a reentrant
        mutex; inner ones only count down).

        The delete runs in a task of the session: cancelling this call (anyio or native
        asyncio) does not stop it, and a failed delete is retried in the background.

        :raises NotOwnerError: if the current task does not hold it through this object
        :raises LockLost: if it had been lost before this release
        """
        claim = self._claim()
        if claim is None or claim.hold is None or (claim.lock is not self and not self._reentrant):
            raise NotOwnerError(f"{self._what} {self._name!r} is not held by this task")
        claim.depth -= 1
        if claim.depth > 0:
            return
        self._claims().pop((self._prefix, _task_id()), None)
        hold = claim.hold
        try:
            await hold._end()
        except LockLost as exc:
            self._released(hold, claim.granted_at, exc)
            raise
        self._released(hold, claim.granted_at, None)

    def _released(self, hold: Hold, granted_at: float, lost: LockLost | None) -> None:
        held = monotonic() - granted_at
        if self._counted:
            self._source.counters.released(
                self._what, self._name, hold.fence, held, lost is not None
            )
        if lost is not None:
            # The name, its fence, and why (at DEBUG for a place that coord keeps for
            # itself, whose loss no user acts on: see _loss_warned).
            log = _log.warning if self._loss_warned else _log.debug
            log("%s %s", self._what, lost)
        elif _log.isEnabledFor(logging.DEBUG):
            what, name = self._what, self._name
            _log.debug("%s %r released (fence %d) after %.3fs", what, name, hold.fence, held)

    async def __aenter__(self) -> Hold:
        hold = await self._take(wait=True)  # acquire()'s work, without its frame
        claim = self._claim()
        assert claim is not None
        opens = hold._scope is None
        if opens:
            hold._enter_body()  # the outermost block runs in the scope a loss cancels
        claim.blocks.append(opens)
        return hold

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        claim = self._claim()
        if claim is None or claim.hold is None or not claim.blocks:
            raise NotOwnerError(f"{self._what} {self._name!r} is not held by this task")
        opened = claim.blocks.pop()
        swallowed = claim.hold._exit_body(exc_type, exc_val, exc_tb) if opened else False
        if opened and claim.hold.lost:
            claim.depth = 1  # a lost hold ends here, whatever acquire() left unreleased
        # Raises LockLost if it was lost (the body's exception becomes its context);
        # otherwise the body's own exception propagates untouched.
        await self.release()
        return swallowed
