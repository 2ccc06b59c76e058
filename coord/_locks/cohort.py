"""Cohort mode: a client's tasks queue locally behind one key in the global queue.

``client.mutex(name, local_handoff=k)``: the "local lock in front of the remote one" of
Spring's ``RedisLockRegistry``, taken to its conclusion as in lock cohorting (Dice,
Marathe, Shavit, 2012). The tasks of one client that want one mutex form a *cohort*:

* only one of them at a time registers a waiter key in the global (store) queue, on
  behalf of all; the others wait in a local FIFO, with no request to the store;
* a holder that releases while local tasks wait hands the lock straight to the first of
  them, with no round trip, as long as the key has been handed on fewer than *k* times;
  then it deletes the key as in strict mode, and the first local waiter registers a new
  one at the tail of the global queue. So another client waits at most for k + 1 holds
  of each client ahead of it, and a local waiter for the holds of its own cohort ahead
  of it plus, per key of its cohort, the keys of the other clients.

Each holder gets its own :class:`CohortHold` with the fence ``revision << 16 | seq``
(:func:`coord._core.keys.fence_of`), *seq* counting the handoffs of the key: fences strictly
increase from holder to holder, and compare with strict-mode fences of the same lock.
A CohortHold follows the key's :class:`~coord.Hold`: if the key or its session is lost,
the holder's body is cancelled and it gets :exc:`coord.LockLost`, exactly as in strict
mode; a key known to be lost is never handed on, and the next local waiter registers a
new one at once.

What a local handoff does not do is ask the store: a key deleted by *another client*
(an operator, a bug) is known when its guard watch reports the deletion: within a round
trip once the key has existed for :data:`coord._locks.hold.GUARD_DELAY`, as in strict mode for
a holder in its body, so within about a second in all. A handoff made in that window
passes the key on; its new holder is then cancelled and gets LockLost, and its fence,
lower than that of any later key, lets the protected resource refuse its writes. (In
strict mode the release's guarded delete would have told the releasing holder instead.)
Losses of the session — the common case — are known locally and never handed on.
"""

from __future__ import annotations

import weakref
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .._core.exceptions import LockedError, LockLost
from .._core.keys import FENCE_SHIFT
from .hold import Hold

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._sessions.session import SessionSource

__all__ = ["MAX_HANDOFFS", "Cohort", "CohortHold", "cohort_of"]

#: The most local handoffs of one key: its holders' places must fit in a fence's low bits.
MAX_HANDOFFS = (1 << FENCE_SHIFT) - 1

# Per session source (one client), per lock prefix: the cohort, while it is not idle.
_cohorts: weakref.WeakKeyDictionary[SessionSource, dict[str, Cohort]] = weakref.WeakKeyDictionary()


def cohort_of(source: SessionSource, prefix: str) -> Cohort:
    """The cohort of *source*'s tasks that want the lock at *prefix*."""
    cohorts = _cohorts.get(source)
    if cohorts is None:
        cohorts = _cohorts[source] = {}
    cohort = cohorts.get(prefix)
    if cohort is None:
        cohort = cohorts[prefix] = Cohort(cohorts, prefix)
    return cohort


class _Ticket:
    """A local waiter: woken with a hold handed to it, or told to register the key."""

    __slots__ = ("event", "hold", "register")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.hold: CohortHold | None = None
        self.register = False


class Cohort:
    """The tasks of one client that want one lock in cohort mode.

    Invariant: ``busy`` while a task holds the lock or registers the key for the
    cohort; the tickets wait only while busy; ``key`` is the granted key's hold while a
    task holds through it.
    """

    def __init__(self, registry: dict[str, Cohort], prefix: str) -> None:
        self._registry = registry
        self._prefix = prefix
        self.key: Hold | None = None
        self.seq = 0
        self.handoffs = 0
        self.busy = False
        self.tickets: deque[_Ticket] = deque()

    def __repr__(self) -> str:
        state = "holding" if self.key is not None else "registering" if self.busy else "idle"
        return f"<coord.Cohort {self._prefix!r} {state} waiting={len(self.tickets)}>"

    async def acquire(
        self, turn: Callable[[], Awaitable[Hold]], *, wait: bool, name: str, handoffs: int
    ) -> CohortHold:
        """Take the lock for the current task: handed on by a local holder, or through
        a key that *turn* registers and waits for (strict mode's acquire).

        A checkpoint. If cancelled, nothing is held: a hold handed to the task meanwhile
        is handed on (or its key deleted by a task of the session), and the duty of
        registering passes to the next local waiter.

        :param handoffs: how many times a key may be handed on (the mutex's
            ``local_handoff``: the task that registers a key sets it for that key)
        :raises LockedError: with ``wait=False``, if a task of this client holds it or
            is registering, or (from *turn*) another client holds it
        """
        queued = self.busy  # behind a task of this client: it waits (or refuses)
        if queued:
            if not wait:
                await anyio.lowlevel.checkpoint()
                raise LockedError(f"{name!r} is taken (by a task of this client)")
            ticket = _Ticket()
            self.tickets.append(ticket)
            try:
                await ticket.event.wait()
            except BaseException:
                self._give_up(ticket)
                raise
            if ticket.hold is not None:
                ticket.hold._waited = True
                return ticket.hold
        else:
            self.busy = True
        try:
            key = await turn()
        except BaseException:
            self._next_registers()
            raise
        self.key, self.seq, self.handoffs = key, 0, handoffs
        key._follow(partial(self._check_key, key))
        held = CohortHold(key, 0, self)
        held._waited = key._waited or queued
        return held

    def _check_key(self, key: Hold) -> None:
        """News about *key*: once it is lost, it is this cohort's no more. The next local
        waiter registers a new key at once, as a strict waiter would, even while the lost
        key's holder is still being cancelled (or if it never releases)."""
        if self.key is key and key.lost:
            self._next_registers()

    def _give_up(self, ticket: _Ticket) -> None:
        """A local waiter is gone (cancelled): pass on whatever it was given."""
        if ticket.hold is not None:
            held = ticket.hold
            held._finish()
            key = self._hand_on(held)
            if key is not None:
                key._finish()
                key.session.discard(key.entry)  # nobody held it: delete in the background
        elif ticket.register:
            self._next_registers()
        else:
            self.tickets.remove(ticket)

    def _next_registers(self) -> None:
        """Nobody holds through a key of this cohort: the first local waiter registers
        the next one; with none, the cohort is idle."""
        self.key = None
        if self.tickets:
            ticket = self.tickets.popleft()
            ticket.register = True
            ticket.event.set()
        else:
            self.busy = False
            if self._registry.get(self._prefix) is self:
                del self._registry[self._prefix]

    def _hand_on(self, held: CohortHold) -> Hold | None:
        """*held* is released: hand the key to the first local waiter if it may be
        handed on, and return None; else return the key, to be deleted by the caller."""
        key = held._key
        if self.key is not key:
            return key  # it was lost, and the cohort has moved on
        if self.tickets and self.seq < self.handoffs and not key.lost:
            self.seq += 1
            ticket = self.tickets.popleft()
            ticket.hold = CohortHold(key, self.seq, self)
            ticket.event.set()
            return None
        self._next_registers()
        return key

    async def release(self, held: CohortHold) -> None:
        """Release *held* (see :meth:`CohortHold._end`)."""
        key = self._hand_on(held)
        if key is None:
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return
        try:
            await key._end()  # the guarded delete, as in strict mode
        except LockLost:
            held._frozen = True
            held._set_lost()
            raise held._lost_error(
                f"{held.name!r} was lost while held (fence {held.fence}): {key._why()}"
            ) from None


class CohortHold(Hold):
    """A task's hold on a lock in cohort mode: the *seq*-th holder through one key.

    Lost when the key's hold is lost (it follows it: no watch of its own); its fence is
    the key's fence plus *seq*.
    """

    def __init__(self, key: Hold, seq: int, cohort: Cohort) -> None:
        self._setup(key.name, key.fence | seq, key.session, key.entry)
        self._key = key
        self._cohort = cohort
        self._granted = True
        self._epoch = key._epoch
        self._unlisten = key._follow(self._poke)

    def _is_lost(self) -> bool:
        return self._key._is_lost()

    def _why(self) -> str:
        return self._key._why()

    def _key_gone(self) -> None:
        self._key._key_gone()

    async def _end(self) -> None:
        """Release: hand the key to the next local waiter, or delete it; raise LockLost
        if the lock had been lost (then it is never handed on: the key's own release
        raises, see :meth:`Cohort.release`)."""
        self._finish()
        await self._cohort.release(self)
