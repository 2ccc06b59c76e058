"""How a claim on a queued job ends: ack, retry in place, park, dead-letter, or release.

Each ending is one transaction guarded by the claim (its entry must still exist) and by
the job's version as claimed, so a worker whose claim was lost or taken over can never
end the job for the worker that holds it now. It runs in a task of the session, which
owns its outcome: cancelling the caller (anyio or native asyncio) does not stop it. A
request whose reply was lost is resolved by reading the claim again: while the session
lives only this transaction deletes it.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio

from .._core import retry as _retry
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClaimLost,
    ClosedError,
    SessionExpiredError,
)
from ..abc import Create, Remove, Update
from . import records as _records
from .commit import apply

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .._locks.hold import Hold
    from .._sessions.session import Session
    from ..abc import Entry, Op
    from .commit import Answer
    from .records import Job

    #: Sends an ack with the worker's next claim (``Looker.ack_and_claim``): given the
    #: ack's operations and how to log an answer its caller did not wait for, the ack's
    #: answer (None: none within the TTL; "unsent": it was not sent so, and goes alone).
    Then = Callable[
        [list[Op], Callable[[Answer | None], None]],
        Awaitable[Answer | Literal["unsent"] | None],
    ]

__all__ = [
    "Exhausted",
    "Outcome",
    "RetryPolicy",
    "end_claim",
    "lost_attempt",
    "release_now",
    "release_ops",
    "release_soon",
    "resolve_soon",
]

Exhausted = Literal["park", "dead_letter"]
#: What became of a write: applied, certainly not applied, or not known.
Outcome = Literal["done", "not done", "unknown"]

_log = logging.getLogger("coord")


@dataclass(frozen=True)
class RetryPolicy:
    """A queue's retry policy (see :class:`coord.Queue`)."""

    max_attempts: int
    on_exhausted: Exhausted
    delay: float
    max_delay: float
    dead_prefix: str


async def end_claim(
    job: Job,
    exc: BaseException | None,
    retry: RetryPolicy,
    *,
    cut_short: bool = False,
    then: Then | None = None,
) -> None:
    """End *job*'s claim: ack if *exc* is None, retry/park/dead-letter for an Exception,
    release as it was for a cancellation or a deferred job.

    :param cut_short: the body was cancelled because the claim was lost
    :param then: sends an ack with the worker's next claim (``queue.run()``)
    :raises ClaimLost: if the claim had been lost (``outcome="not done"``), the store
        refused the ending (``"not done"``), or its outcome is unknown (``"unknown"``);
        not for a cancelled block, whose cancellation propagates as it is
    """
    hold = job._hold
    session = hold.session
    if hold._finish():
        # Lost while the body ran: no ending was sent. If the session lives on (an
        # interruption, ZooKeeper's SUSPENDED), the job is given back as it was: an
        # outage the session survives never counts as an attempt.
        release_soon(session, job._entry, job._state, job.payload, hold.entry)
        if job._given_back is not None:
            job._given_back()
        raise ClaimLost(_lost(job, exc, cut_short), outcome="not done", job_id=job.id)
    cancelled = exc is not None and not isinstance(exc, Exception)
    if job._deferred or cancelled:
        # Give it back as it was, no attempt counted.
        release = release_ops(job._entry, job._state, job.payload, hold.entry)
        try:
            outcome = await _end(session, release, hold, job, "release")
        finally:
            if job._given_back is not None:
                job._given_back()  # (also when the caller is cancelled: it may be back)
        if outcome != "done" and not cancelled and exc is None:
            raise _not_done(job, "release", outcome)
        return
    ops: list[Op] = (
        [Remove(job._entry), Remove(hold.entry)] if exc is None else _nack(job, exc, retry)
    )
    what = "ack" if exc is None else "release"
    try:
        answer = (
            "unsent" if then is None or exc is not None else await then(ops, _late(what, job, hold))
        )
        if answer == "unsent":
            outcome = await _end(session, ops, hold, job, what)
        else:
            outcome = _outcome(answer)
    finally:
        if exc is not None and job._given_back is not None:
            job._given_back()  # retried in place: it may be claimable at once
    if outcome != "done":
        hold._frozen = True
        raise _not_done(job, what, outcome)
    if exc is None and job._acked is not None:
        job._acked()


async def _end(session: Session, ops: list[Op], hold: Hold, job: Job, what: str) -> Outcome:
    """Apply the ending *ops* in a task of the session: "done", "not done" (the store
    refused it: the claim or the job was no longer as claimed) or "unknown". When it is
    unknown only because the answer took longer than the TTL, the task goes on and logs
    the answer when it comes."""

    late = _late(what, job, hold)
    # An ending: a close of the client waits for its answer before it revokes the lease
    # that the ending is guarded by (else an ack out then is refused, and its job runs
    # again as a lost attempt).
    answer = await session.settle(
        lambda: apply(session, ops, hold.entry, job._entry), undo=late, ending=True
    )
    return _outcome(answer)


def _outcome(answer: Answer | None) -> Outcome:
    """The outcome of an ending from the answer of its transaction (None: none came
    within the TTL)."""
    if answer == "done":
        return "done"
    return "not done" if answer == "refused" else "unknown"


def _late(what: str, job: Job, hold: Hold) -> Callable[[Answer | None], None]:
    """Logs the answer to an ending whose worker did not wait for it."""

    def late(answer: Answer | None) -> None:
        _log.warning(
            "%s of job %s (claim fence %d), whose answer its worker did not wait for: %s",
            what,
            job.id,
            hold.fence,
            _LATE.get(answer or "lost", "still unknown (the session was lost with it)"),
        )

    return late


_LATE = {"done": "it was applied", "refused": "the store refused it: not applied"}


def _lost(job: Job, exc: BaseException | None, cut_short: bool) -> str:
    """What a claim lost before its ending was sent did not do, and what its body may
    have done."""
    hold = job._hold
    lost = f"the claim (fence {hold.fence}) was lost: {hold._why()}"
    if cut_short:
        done = "its body was cancelled, nothing was acked"
    elif exc is None:
        done = "the ack was not written, though the body ran to its end: its work may be done"
    elif isinstance(exc, Exception):
        done = "the retry was not written (the body raised): its work may be partly done"
    else:
        done = "the job was not given back (the body was cancelled)"
    return (
        f"{hold.name!r}: {lost}; {done}. The job is another worker's to do: make its side "
        "effects idempotent with job.fence"
    )


def _not_done(job: Job, what: str, outcome: Outcome) -> ClaimLost:
    hold = job._hold
    if outcome == "not done":
        message = (
            f"the {what} was refused: the claim (fence {hold.fence}) was no longer ours; "
            "the job is another worker's to do"
        )
    else:
        message = (
            f"the outcome of the {what} is unknown (claim fence {hold.fence}): no answer "
            "came from the store (in time, or before the session was lost), so it may have "
            "been applied, or the job may run again; a late answer is logged when it comes"
        )
    return ClaimLost(f"{hold.name!r}: {message}", outcome=outcome, job_id=job.id)


def _nack(job: Job, exc: BaseException, retry: RetryPolicy) -> list[Op]:
    """Retry the job in place, or park or dead-letter it after its last attempt, with
    *exc* as its error (cut to fit by :func:`_records.encode`). Never a transaction that the
    store refuses on size, which would leave the claim, and the job's key, blocked: if
    the job's header still does not fit, it is parked or dead-lettered with a shortened
    error; if not even that fits (a header written by something else), only the claim
    is removed, and the next look counts a lost attempt."""
    state = job._state
    attempt = state.attempt + 1
    error = f"{type(exc).__name__}: {exc}"
    claim = Remove(job._hold.entry)
    limit = job._hold.session.backend.max_value_size
    if attempt < retry.max_attempts:
        delay = min(retry.delay * 2 ** (attempt - 1), retry.max_delay)
        state = state.with_(attempt=attempt, not_before=time.time() + delay, error=error)
        ops: list[Op] = [Update(job._entry, _records.encode(state, job.payload)), claim]
    else:
        state = state.with_(attempt=attempt, error=error)
        ops = [*_exhausted(job._entry, state, job.payload, retry), claim]
    if _fits(ops, limit):
        return ops
    short = job._state.with_(attempt=attempt, error=f"{type(exc).__name__} (message dropped)")
    ops = [*_exhausted(job._entry, short, job.payload, retry), claim]
    return ops if _fits(ops, limit) else [claim]


def _fits(ops: list[Op], limit: int) -> bool:
    return all(len(op.value) <= limit for op in ops if isinstance(op, Update | Create))


def _exhausted(entry: Entry, state: _records.State, payload: bytes, retry: RetryPolicy) -> list[Op]:
    """Park the job in place, or move it to the dead letters (its last attempt failed)."""
    state = state.with_(not_before=0.0, claim=None)
    if retry.on_exhausted == "park":
        return [Update(entry, _records.encode(state.with_(parked=True), payload))]
    # A fresh entry id (the job's id is in the header): it can never meet another one.
    dead = Create(retry.dead_prefix, f"@d{uuid.uuid4().hex}", _records.encode(state, payload))
    return [Remove(entry), dead]


def lost_attempt(
    entry: Entry, state: _records.State, payload: bytes, retry: RetryPolicy
) -> tuple[_records.State, list[Op] | None]:
    """A job whose last claim ended with neither an ack nor a release (its worker died,
    or was cut off): that attempt counts, so that a job which kills its worker every time
    (a poison pill) ends parked or dead-lettered instead of going round forever.

    Returns the header to claim it with, or the transaction that parks or dead-letters
    it when that was its last attempt."""
    error = "its worker was lost while working on it (no ack, no release)"
    state = state.with_(attempt=state.attempt + 1, error=error, claim=None)
    if state.attempt < retry.max_attempts:
        return state, None
    return state, _exhausted(entry, state, payload, retry)


def release_ops(entry: Entry, state: _records.State, payload: bytes, claim: Entry) -> list[Op]:
    """Give a claimed job back as it was (no attempt counted)."""
    return [Update(entry, _records.encode(state.with_(claim=None), payload)), Remove(claim)]


def release_soon(
    session: Session, entry: Entry, state: _records.State, payload: bytes, claim: Entry
) -> None:
    """Give back a claim that nobody will work on, in a task of the session (the caller
    was cancelled). Not a checkpoint."""
    if session.lost:
        return  # the claim goes with the session
    try:
        # Before the session's close revokes its lease: else the job names a dead claim.
        session.start_ending(partial(_release, session, entry, state, payload, claim))
    except ClosedError:
        pass


async def release_now(
    session: Session, entry: Entry, state: _records.State, payload: bytes, claim: Entry
) -> None:
    """Give back a claim that nobody will work on, and wait until the store has it back:
    :func:`release_soon` for a caller that is not cancelled but stops (``run()``'s worker
    giving back the job claimed with its last ack), so that what comes after it (the
    client closed once ``run()`` returns, its lease revoked) cannot overtake it and leave
    the job naming a dead claim, which the next claim counts as a lost attempt. In a task
    of the session, as an ending: shielded from anyio cancellation up to the TTL, and a
    native cancellation stops the wait, not the release. A checkpoint."""
    if session.lost:
        return  # the claim goes with the session
    try:
        await session.settle(partial(_release, session, entry, state, payload, claim), ending=True)
    except (ClosedError, SessionExpiredError):
        pass  # closed meanwhile: the claim goes with the session
    except BackendError as exc:  # (told, not raised into the worker loop's drain)
        _log.warning("job %s: giving back its claim failed: %s", entry.key, exc)


async def _release(
    session: Session, entry: Entry, state: _records.State, payload: bytes, claim: Entry
) -> None:
    if await apply(session, release_ops(entry, state, payload, claim), claim, entry) == "refused":
        await session.delete(claim)


def resolve_soon(
    session: Session, job: Entry, claims: str, claim_id: str, provisional: Entry
) -> anyio.Event | None:
    """A claim of *job* whose outcome is unknown (its reply was lost) and that nobody
    will work on: if the store made it, give it back as it was, in a task of the session,
    so that no attempt counts (a claim merely deleted leaves the job naming a dead claim:
    the next claim counts a "lost worker" attempt, and a job with one attempt left would
    be parked or dead-lettered without ever having run). Not a checkpoint.

    Returns an event set once that is done, for a caller that must not end before the
    job is back (``run()``'s joint ack and claim: its worker may stop next, and its client
    be closed then, which would leave the job naming a dead claim); None if nothing
    is to be done."""
    if session.lost:
        return None  # the claim, if made, goes with the session
    resolved = anyio.Event()

    async def run() -> None:
        try:
            await _resolve(session, job, claims, claim_id, provisional)
        finally:
            resolved.set()

    try:
        session.start_ending(run)  # before the session's close revokes its lease
    except ClosedError:
        return None
    return resolved


async def _resolve(
    session: Session, job: Entry, claims: str, claim_id: str, provisional: Entry
) -> None:
    backend = session.backend
    for attempt in _retry.attempts():
        try:
            made = await backend.find(claims, claim_id, session.lease)
            now = None if made is None else await backend.get(job.key)
            break
        except BackendUnavailable:
            if session.lost:
                return
            await _retry.backoff(attempt)
        except SessionExpiredError:
            return
        except BackendError as exc:  # (told, not raised into the session's tasks)
            _log.warning("job %s: its claim of unknown outcome: %s", job.key, exc)
            session.discard(provisional)
            return
    else:  # pragma: no cover
        return
    if made is None:
        return  # not made: nothing to give back
    if now is None or now.revision != job.revision:
        await session.delete(made)  # (the job went meanwhile: only the claim is left)
        return
    state, payload = _records.decode(now)
    if state.claim != claim_id[2:]:
        await session.delete(made)
    elif await apply(session, release_ops(now, state, payload, made), made, now) == "refused":
        await session.delete(made)
