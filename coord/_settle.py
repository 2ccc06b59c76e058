"""How a claim on a queued job ends: ack, retry in place, park, dead-letter, or release.

Each ending is one transaction guarded by the claim (its entry must still exist) and by
the job's version as claimed, so a worker whose claim was lost or taken over can never
end the job for the worker that holds it now. It runs in a task of the session, which
owns its outcome: cancelling the caller (anyio or native asyncio) does not stop it. A
request whose reply was lost is resolved by reading the claim again: while the session
lives only this transaction deletes it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from . import _jobs, _retry
from ._exceptions import BackendUnavailable, ClosedError, SessionExpiredError
from .abc import Create, Remove, Update

if TYPE_CHECKING:
    from ._queue import Job
    from ._session import Session
    from .abc import Entry, Op

__all__ = ["Exhausted", "Retry", "lost_attempt", "release_ops", "release_soon", "settle"]

Exhausted = Literal["park", "dead_letter"]


@dataclass(frozen=True)
class Retry:
    """A queue's retry policy (see :class:`coord.Queue`)."""

    max_attempts: int
    on_exhausted: Exhausted
    delay: float
    max_delay: float
    dead_prefix: str


async def settle(job: Job, exc: BaseException | None, retry: Retry) -> None:
    """End *job*'s claim: ack if *exc* is None, retry/park/dead-letter for an Exception,
    release as it was for a cancellation or a deferred job.

    :raises ClaimLost: if the claim had been lost, the ending was refused, or its outcome
        is unknown (a lost reply, and the session lost before it could be read again)
    """
    hold = job._hold
    session = hold.session
    if hold._finish():
        session.discard(hold.entry)  # it may remain after an interruption
        raise hold._lost_error(
            f"{hold.name!r}: the claim was lost (fence {hold.fence}): {hold._why()}"
        )
    if job._deferred or (exc is not None and not isinstance(exc, Exception)):
        # Deferred, or cancelled from outside: give it back as it was, no attempt counted.
        release = release_ops(job._entry, job._state, job.payload, hold.entry)
        await session.settle(lambda: _apply(session, release, hold.entry, job._entry))
        return
    ops: list[Op] = (
        [Remove(job._entry), Remove(hold.entry)] if exc is None else _nack(job, exc, retry)
    )
    done = await session.settle(lambda: _apply(session, ops, hold.entry, job._entry))
    if done != "done":
        hold._frozen = True
        what = "ack" if exc is None else "release"
        if done == "lost":
            raise hold._lost_error(
                f"{hold.name!r}: the outcome of the {what} is unknown (claim fence "
                f"{hold.fence}): its reply was lost and the session with it, so it may "
                "have been applied, or the job may be claimed again"
            )
        raise hold._lost_error(
            f"{hold.name!r}: the {what} was refused: the claim (fence {hold.fence}) was "
            "no longer ours"
        )


def _nack(job: Job, exc: BaseException, retry: Retry) -> list[Op]:
    """Retry the job in place, or park or dead-letter it after its last attempt, with
    *exc* as its error (cut to fit by :func:`_jobs.encode`). Never a transaction that the
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
        ops: list[Op] = [Update(job._entry, _jobs.encode(state, job.payload)), claim]
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


def _exhausted(entry: Entry, state: _jobs.State, payload: bytes, retry: Retry) -> list[Op]:
    """Park the job in place, or move it to the dead letters (its last attempt failed)."""
    state = state.with_(not_before=0.0, claim=None)
    if retry.on_exhausted == "park":
        return [Update(entry, _jobs.encode(state.with_(parked=True), payload))]
    # A fresh entry id (the job's id is in the header): it can never meet another one.
    dead = Create(retry.dead_prefix, f"@d{uuid.uuid4().hex}", _jobs.encode(state, payload))
    return [Remove(entry), dead]


def lost_attempt(
    entry: Entry, state: _jobs.State, payload: bytes, retry: Retry
) -> tuple[_jobs.State, list[Op] | None]:
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


def release_ops(entry: Entry, state: _jobs.State, payload: bytes, claim: Entry) -> list[Op]:
    """Give a claimed job back as it was (no attempt counted)."""
    return [Update(entry, _jobs.encode(state.with_(claim=None), payload)), Remove(claim)]


def release_soon(
    session: Session, entry: Entry, state: _jobs.State, payload: bytes, claim: Entry
) -> None:
    """Give back a claim that nobody will work on, in a task of the session (the caller
    was cancelled). Not a checkpoint."""
    if session.lost:
        return  # the claim goes with the session
    ops = release_ops(entry, state, payload, claim)

    async def run() -> None:
        if await _apply(session, ops, claim, entry) == "refused":
            await session.delete(claim)

    try:
        session.start_soon(run)
    except ClosedError:
        pass


async def _apply(session: Session, ops: list[Op], claim: Entry, job: Entry) -> str:
    """Run the transaction until its outcome is known: "done", "refused" or "lost".

    After a lost reply, what the store holds tells: the transaction deletes our claim
    and removes or rewrites the job. The claim gone with the job unchanged means the
    claim went some other way (our lease expired on the store): not done."""
    backend = session.backend
    unknown = False
    for attempt in _retry.attempts():
        try:
            if unknown and await backend.get(claim.key) is None:
                now = await backend.get(job.key)
                changed = now is None or now.version != job.version
                return "done" if changed and not session.lost else "lost"
            unknown = False
            return "done" if await backend.transact(ops) is not None else "refused"
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
