"""Commit: the transactions that end claims, applied until their outcome is known, and
a session's acks grouped so that a busy worker pool asks the store for fewer writes.

Each ending of a claim (ack, retry, park, dead letter, release) is one transaction
guarded by its claim and its job as claimed (:mod:`coord._jobs.endings`). Acks (two
removals each: the ending of nearly every job, and no payload to carry) are independent
of each other, so several can be one transaction, which the store applies whole or, if
any guard fails, not at all. :class:`Committer` does this as a group commit, with no
timer: an ack that comes while another of the same session is in flight waits for it,
then goes with every ack that came meanwhile (up to :data:`_MOST` operations), as one
transaction. Alone, an ack is sent at once, as without grouping. A second group goes
while one is out once at least half as many wait as that one carries: so the two workers
of a client each keep a transaction out, where they took turns, one at a time (etcd,
``run()``, 8 workers over 4 clients, A/B in the same minutes: 1,290-1,350 jobs/s before,
1,683-1,762 after; at 32 workers no change). A group the store
refused tells its members nothing (one guard failed, maybe not theirs): each is then
sent alone, and its own answer is the truth; a group whose answer was lost is unknown
to each of its members, as their own transaction would be, and each finds out alone.

The joint transactions of ``queue.run()`` (an ack and the claim of the worker's next job,
:func:`coord._jobs.claim.claim_with`) group too (:meth:`Committer.transact_joint`). Their
claims come from the looker's stock, and after a conflict lookers keep to their own lanes,
so another client's claim of the same job seldom refuses a group: measured on etcd (2,000
jobs, 32 workers over 4 clients, ``run()``), 0.54-0.72 transactions a job where there were
1.3, 7-42 groups refused of about 600, and 1.2x the jobs a second (ZooKeeper: 1.1x). Claims
of one transaction share its revision, so each is numbered in it (its fence's ``seq``,
:func:`coord._core.keys.fence_of`): fences stay distinct, and strictly increase claim
after claim. Claims alone (``async with queue.claim()``, a looker's round) are not
grouped: they are refused far more often (several lookers reach for the head of the
queue), and a refused group costs each of its members a transaction more. Acks, measured
on etcd (3,000 jobs, 32 workers over 4 clients): 2.3 transactions a job before, 1.65
after (8 workers: 2 workers a client seldom ack at once, and nothing changes).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import anyio

from .._core import retry as _retry
from .._core.exceptions import BackendUnavailable, SessionExpiredError
from ..abc import Remove

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._sessions.session import Session
    from ..abc import Entry, Op

__all__ = ["Answer", "Committer", "Stamped", "apply", "committer_for"]

Result = tuple["Entry | None", ...] | None

#: What became of a transaction: applied, refused by the store, or unknown because the
#: session was lost with it.
Answer = Literal["done", "refused", "lost"]

#: A joint transaction's operations, given the number of its claim among the claims of
#: the transaction it goes in (0 alone).
Stamped = Callable[[int], "Sequence[Op]"]

# A group has at most this many operations (a transaction takes at most
# coord.abc.Backend.max_ops).
_MOST = 32
# Groups of a session in flight at once. A second goes only with at least half as many
# members as the first (see Committer._may_send).
_IN_FLIGHT = 2

_COMMITTERS: weakref.WeakKeyDictionary[Session, Committer] = weakref.WeakKeyDictionary()


def committer_for(session: Session) -> Committer:
    """The committer of *session* (one per session, made on first use)."""
    committer = _COMMITTERS.get(session)
    if committer is None:
        committer = _COMMITTERS[session] = Committer(session)
    return committer


async def apply(
    session: Session, ops: list[Op], claim: Entry, job: Entry, *, unknown: bool = False
) -> Answer:
    """Run the transaction *ops* until its outcome is known.

    After a lost reply (or with *unknown*: an earlier attempt's outcome is not known),
    what the store holds tells: the transaction deletes our claim and removes or
    rewrites the job. The claim gone with the job unchanged means the claim went some
    other way (our lease expired on the store): not done."""
    backend = session.backend
    for attempt in _retry.attempts():
        try:
            if unknown and await backend.get(claim.key) is None:
                now = await backend.get(job.key)
                changed = now is None or now.version != job.version
                return "done" if changed and not session.lost else "lost"
            unknown = False
            if attempt == 0:
                result = await committer_for(session).transact(ops)
            else:
                result = await backend.transact(ops)
            return "done" if result is not None else "refused"
        except SessionExpiredError:
            # The store says the session is over (ZooKeeper, after a partition longer
            # than the TTL): the claim went with it, and an earlier attempt whose reply
            # was lost may have been applied. Its outcome is unknown, never "refused".
            return "lost"
        except BackendUnavailable:
            unknown = True
            if session.lost:
                return "lost"
            await _retry.backoff(attempt)
    raise AssertionError("unreachable")  # pragma: no cover


class _Member:
    """One transaction waiting to be sent with a group."""

    __slots__ = ("answered", "error", "ops", "result", "sent", "seq", "stamped", "told", "turn")

    def __init__(self, ops: Sequence[Op], stamped: Stamped | None = None) -> None:
        self.ops = ops
        self.stamped = stamped  # a joint transaction: its claim is numbered in its group
        self.seq = 0  # that number, once sent
        self.answered = anyio.Event()  # its group was sent, and answered or not
        self.turn: anyio.Event | None = None  # set when a group may be sent
        self.sent = False  # taken into a group
        self.told = False  # the group's answer is this one's (result or error)
        self.result: Result = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        """Its group was sent and answered or not, or it goes in none: wake it (also
        from a turn it waits for and no longer needs)."""
        self.answered.set()
        if self.turn is not None:
            self.turn.set()


class Committer:
    """Sends the acks of one session, grouped (see the module's docstring)."""

    def __init__(self, session: Session) -> None:
        # The backend, not the session: a value of _COMMITTERS that held its key would
        # keep every session that ever acked alive (and so its entry in _COMMITTERS).
        self._backend = session.backend
        self._waiting: list[_Member] = []
        self._in_flight = 0  # groups being sent
        self._flying = 0  # their members

    async def transact(self, ops: Sequence[Op]) -> Result:
        """``backend.transact(ops)``, with others of the session if some are waiting: the
        entries *ops* wrote, or None if the store refused them. Call it in a task that
        the session owns (``Session.settle``), which is cancelled only with the session.

        :raises BackendUnavailable: if the answer was lost (the outcome is unknown)
        :raises SessionExpiredError: if the store no longer knows the session's lease
        """
        if len(ops) > _MOST or not all(isinstance(op, Remove) for op in ops):
            return await self._backend.transact(ops)  # not an ack: alone
        return await self._join(_Member(ops))

    async def transact_joint(self, stamped: Stamped) -> tuple[Result, int]:
        """A joint transaction (an ack and a claim), with others of the session if some
        are waiting: its operations are ``stamped(seq)``, where *seq* numbers its claim
        among the claims of the transaction it goes in. Returns what :meth:`transact`
        does, and the *seq* it went with (0 alone).

        :raises BackendUnavailable: if the answer was lost (the outcome is unknown)
        :raises SessionExpiredError: if the store no longer knows the session's lease
        """
        member = _Member(stamped(0), stamped)
        if len(member.ops) > _MOST:
            return await self._backend.transact(member.ops), 0
        result = await self._join(member)
        return result, member.seq

    async def _join(self, member: _Member) -> Result:
        """Send *member* with a group (see :meth:`transact`)."""
        self._waiting.append(member)
        while not member.sent:
            if self._may_send():
                await self._send_group()  # the oldest waiting, this one among them or not
                continue
            member.turn = anyio.Event()
            try:
                await member.turn.wait()
            except BaseException:  # cancelled with the session
                if not member.sent:
                    self._waiting.remove(member)
                self._wake_next()
                raise
        await member.answered.wait()
        if not member.told:  # the group was refused: alone, for its own answer
            if member.stamped is not None and member.seq:
                member.seq = 0
                member.ops = member.stamped(0)
            return await self._backend.transact(member.ops)
        if member.error is not None:
            raise member.error
        return member.result

    async def _send_group(self) -> None:
        """Send the oldest transactions waiting, as many as fit, as one; tell each what
        is known of it; wake the next one waiting to send the next group.

        Each member of a group is told: a member whose operations could not be made
        (its ``stamped`` raised) its error, and every member, if this task is cancelled
        with the group out, that its outcome is unknown (the transaction may have gone):
        never sent again alone, which a store that applied the group would refuse."""
        group = self._take_group()
        self._in_flight += 1
        self._flying += len(group)
        self._wake_next()  # those left behind (past _MOST) may be enough for a second
        sent = False
        try:
            if group:
                await self._send(group)
            sent = True
        finally:
            self._in_flight -= 1
            self._flying -= len(group)
            for member in group:
                if not sent and not member.told:
                    member.told = True
                    member.error = BackendUnavailable(
                        "the group's sender was cancelled with the group out: its "
                        "outcome is unknown"
                    )
                member.finish()
            self._wake_next()

    def _take_group(self) -> list[_Member]:
        """Take the oldest waiting members, as many as fit in a group, numbering their
        claims; a member whose operations cannot be made is told so, and left out."""
        group: list[_Member] = []
        ops = 0
        claims = 0
        taken = 0
        for member in self._waiting:
            if group and ops + len(member.ops) > _MOST:
                break
            taken += 1
            member.sent = True
            if member.stamped is not None and claims:
                # (its operations' length does not change with the number)
                try:
                    member.ops = member.stamped(claims)
                except Exception as exc:
                    member.told, member.error = True, exc
                    member.finish()
                    continue
                member.seq = claims
            if member.stamped is not None:
                claims += 1
            group.append(member)
            ops += len(member.ops)
        del self._waiting[:taken]
        return group

    def _may_send(self) -> bool:
        """Whether a group of those waiting may be sent now: with none in flight, or with
        fewer than :data:`_IN_FLIGHT` and at least half as many waiting as fly."""
        if not self._in_flight:
            return True
        return self._in_flight < _IN_FLIGHT and 2 * len(self._waiting) >= self._flying

    def _wake_next(self) -> None:
        """Wake the oldest waiting if a group may now be sent (it takes the others)."""
        if self._waiting and self._may_send():
            member = self._waiting[0]
            if member.turn is not None:
                member.turn.set()

    async def _send(self, group: list[_Member]) -> None:
        try:
            result = await self._backend.transact([op for member in group for op in member.ops])
        except (BackendUnavailable, SessionExpiredError) as exc:
            for member in group:  # unknown, or the session is over: for each alike
                member.told, member.error = True, exc
            return
        except Exception as exc:
            if len(group) == 1:
                group[0].told, group[0].error = True, exc
            return  # (refused as a whole for its size, say): each is sent alone
        if result is None and len(group) > 1:
            return  # some guard failed, so none was applied: each is sent alone
        at = 0
        for member in group:
            member.told = True
            if result is not None:
                member.result = result[at : at + len(member.ops)]
            at += len(member.ops)
