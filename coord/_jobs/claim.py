"""Claiming a queued job: who looks, what is claimable, and the claim itself.

* **Who looks.** Each client has one looker per queue (:mod:`coord._jobs.looker`),
  which claims for all of that client's idle workers at once; lookers of different
  clients claim concurrently, and with nothing claimable at most two of them watch.
* **Claimable** = the oldest job that is not claimed by a live claim, not parked, not
  backing off, and (if it has a key) the oldest job of its key: later jobs of a key wait
  until the earlier one is acked or dead-lettered.
* **The claim** is one transaction: the job's header is updated to name a new claim
  (guarded by the job's version, as read) and the claim entry is created on the worker's
  lease. A job's version changes with every claim, so two workers can never both claim
  it; the claim entry dies with the worker's session, which makes the job claimable
  again. The job's fence comes from the claim's creation revision and its number among
  the claims of its transaction (``fence_of(revision, seq)``: ``run()`` sends several
  workers' joint claims as one transaction).
* Reads are in that order — jobs, then claims — so that a claim made after the jobs
  were read fails the guard. While parked jobs are about, an idle looker's watch of the
  claims starts from a read of them made before the jobs read (``Looker._wait_idle``):
  a claim that ended after the jobs were read is seen, even one that came and went
  before the claims were read (an unpark's passing entry, whose job that jobs read saw
  parked).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

import anyio

from .._core import retry as _retry
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClaimLost,
    ClosedError,
    ResyncNeeded,
    SessionExpiredError,
)
from .._core.keys import FENCE_SHIFT, fence_of
from .._locks.hold import Hold
from ..abc import ChangeKind, Create, Entry, Position, Update
from . import records as _records
from .commit import apply, committer_for
from .endings import release_soon, resolve_soon

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from .._sessions.session import Session
    from ..abc import Backend, Lease, Listing, Op
    from .commit import Answer

__all__ = [
    "ClaimHold",
    "Pick",
    "choose_many",
    "claim",
    "claim_value",
    "claim_with",
    "rank",
    "seq_of",
    "wait_for_change",
]


class ClaimHold(Hold):
    """The hold of a claim on a job: lost like a lock, raising ClaimLost. Its fence is
    its claim entry's creation revision and the claim's number among the claims of the
    transaction that made it (``seq``, see :func:`coord._jobs.commit.Committer.transact_joint`)."""

    _lost_error = ClaimLost

    def __init__(self, name: str, session: Session, position: Position, seq: int = 0) -> None:
        super().__init__(name, session, position)
        self.fence = fence_of(position.entry.revision, seq)


class Pick:
    """What :func:`choose_many` found: a job to claim, the *order*-th oldest read."""

    def __init__(self) -> None:
        self.entry: Entry | None = None
        self.state: _records.State | None = None
        self.payload = b""
        self.order = 0


def rank(pick: Pick) -> tuple[int, int]:
    """The order in which claimable jobs are taken: highest priority, then oldest."""
    assert pick.state is not None
    return -pick.state.priority, pick.order


def choose_many(
    jobs: Sequence[Entry],
    live_claims: set[str] | None,
    now: float,
    most: int,
    decode: Callable[[Entry], tuple[_records.State, bytes]] = _records.decode,
    *,
    priorities: bool = False,
) -> tuple[list[Pick], float | None]:
    """The oldest claimable jobs among *jobs* (oldest first), at most *most*, given the
    ids of the claims that exist (None: not read, every claim a job names is taken to be
    live); and when a job backing off or delayed becomes claimable (None if none does).
    Claimable: not claimed by a live claim, not parked, not before its ``not_before`` (a
    backoff or a delay), and the oldest outstanding job of its key (whatever the
    priorities). *decode* reads a job entry (:func:`coord._jobs.records.decode`, or a
    caching one).

    With *priorities*: the claimable jobs of highest priority, then oldest (see
    :func:`rank`), reading every job of *jobs*."""
    picks: list[Pick] = []
    wake_at: float | None = None
    blocked: set[str] = set()
    for order, entry in enumerate(jobs):
        if len(picks) >= most and not priorities:
            break
        state, payload = decode(entry)
        if state.key is not None:
            if state.key in blocked:
                continue  # not the oldest outstanding job of its key
            blocked.add(state.key)
        if state.parked or (
            state.claim is not None and (live_claims is None or state.claim in live_claims)
        ):
            continue
        if state.not_before > now:
            wake_at = state.not_before if wake_at is None else min(wake_at, state.not_before)
            continue
        pick = Pick()
        pick.entry, pick.state, pick.payload, pick.order = entry, state, payload, order
        picks.append(pick)
    if priorities:
        picks = sorted(picks, key=rank)[:most]
    return picks, wake_at


def _claim_ops(
    claims: str, pick: Pick, identity: dict[str, object], lease: Lease
) -> tuple[str, _records.State, list[Op], Entry]:
    """The claim of *pick* on *lease*: its claim id, the job's new header, the
    transaction's operations (the header guarded by the job's version as read, and the
    claim entry on the lease), and the claim entry as known before the answer."""
    assert pick.entry is not None
    assert pick.state is not None
    claim_id = f"@c{uuid.uuid4().hex}"
    header = pick.state.with_(claim=claim_id[2:])  # as id_of() reads it from the key
    ops: list[Op] = [
        Update(pick.entry, _records.encode(header, pick.payload)),
        Create(claims, claim_id, claim_value(identity, pick.state.id), lease),
    ]
    return claim_id, header, ops, Entry(claims + claim_id, lease=lease.id)


def claim_value(identity: dict[str, object], job_id: str, seq: int = 0) -> bytes:
    """A claim entry's value: who claims, the job, and (if not 0) the claim's number
    among the claims of its transaction, which its fence holds (:class:`ClaimHold`)."""
    record = {**identity, "job": job_id, "seq": seq} if seq else {**identity, "job": job_id}
    return _records.to_json(record)


def seq_of(claim: Entry) -> int:
    """The number of *claim* among the claims of its transaction (:func:`claim_value`)."""
    try:
        seq = json.loads(claim.value).get("seq", 0)
    except (ValueError, AttributeError):
        return 0
    return seq if isinstance(seq, int) and 0 <= seq < 1 << FENCE_SHIFT else 0


def _granted(name: str, session: Session, pick: Pick, claimed: Entry, seq: int = 0) -> ClaimHold:
    assert pick.state is not None
    hold = ClaimHold(
        f"{name} job {pick.state.id}", session, Position(claimed, (), claimed.revision), seq
    )
    hold._grant()
    return hold


async def claim(
    session: Session, name: str, claims: str, pick: Pick, identity: dict[str, object]
) -> tuple[ClaimHold, Entry] | None:
    """Claim the job *pick* names, on *session*: ``(hold, updated job entry)``, or None
    if it could not be had (someone else claimed it, or the outcome was unknown: then
    whatever claim was made is deleted and the job can be claimed again)."""
    assert pick.entry is not None
    backend = session.backend
    claim_id, header, ops, provisional = _claim_ops(claims, pick, identity, session.check())
    job_entry = pick.entry
    unknown: list[Exception] = []  # the transaction raised: its outcome is unknown

    async def transact() -> tuple[Entry | None, ...] | None:
        try:
            return await backend.transact(ops)
        except Exception as exc:
            unknown.append(exc)
            raise

    def give_back() -> None:
        # It may have happened: if it did, give the job back as it was (no attempt).
        resolve_soon(session, job_entry, claims, claim_id, provisional)

    def undo(result: tuple[Entry | None, ...] | None) -> None:
        # The caller went away: give back what was claimed for it.
        if result and result[0] and result[1]:
            release_soon(session, result[0], header, pick.payload, result[1])
        elif unknown:
            give_back()
        else:  # refused (nothing to undo), or cancelled with the session
            session.discard(provisional)

    try:
        # Not shielded: a cancelled claim returns at once; undo gives back what it made.
        # An ending: a close waits for its answer, and the give-back, before the revoke.
        result = await session.settle(transact, undo=undo, shield=False, ending=True)
    except BackendUnavailable:
        give_back()
        return None
    if result is None:
        return None
    job, claimed = result
    assert job is not None
    assert claimed is not None
    return _granted(name, session, pick, claimed), job


async def claim_with(
    session: Session,
    name: str,
    claims: str,
    pick: Pick,
    identity: dict[str, object],
    ending: Sequence[Op],
    ended: tuple[Entry, Entry],
    late: Callable[[Answer | None], None],
) -> tuple[Answer | None, tuple[ClaimHold, Entry] | None]:
    """The *ending* of a worker's claim (an ack) and the claim of *pick* for its next
    job, as one transaction: one request where there were two, and requests are most of
    what a job costs the store (``benchmarks/claim_shapes.py``).

    It runs in a task of the session, as an ending alone does (:func:`commit.apply`):
    its caller waits shielded, up to the TTL, and cancelling it does not stop it. If the
    store refused it, it applied neither, and the ending is sent alone: its own answer
    is the truth. With no answer, a claim it may have made is given back (no attempt
    counted), and the ending is read back (*ended*: its claim and job entries). If the
    caller went away, what was claimed for it is given back too, and *late* is told the
    ending's answer when it comes (None: unknown).

    :returns: the ending's answer (None: none within the TTL, the task goes on), and
        ``(hold, updated job entry)`` if the claim was made
    """
    assert pick.entry is not None
    claim_id, header, ops, provisional = _claim_ops(claims, pick, identity, session.check())
    job_entry = pick.entry

    def give_back() -> anyio.Event | None:
        return resolve_soon(session, job_entry, claims, claim_id, provisional)

    assert pick.state is not None
    job_id = pick.state.id
    update, create = ops
    assert isinstance(create, Create)

    def stamped(seq: int) -> list[Op]:
        # Numbered among the claims of the group it goes in (fences stay distinct).
        if not seq:
            return [*ending, update, create]
        value = claim_value(identity, job_id, seq)
        return [*ending, update, Create(create.prefix, create.waiter_id, value, create.lease)]

    seq = 0

    async def work() -> tuple[Answer, tuple[Entry | None, ...] | None]:
        nonlocal seq
        try:
            result, seq = await committer_for(session).transact_joint(stamped)
        except Exception:  # (also cancelled with the session: undo gives it back)
            # It may have been applied: the claim is given back before the answer, so
            # that a worker that stops next, and its client closed then, find the job
            # back (a close first would leave it naming a dead claim: a lost attempt).
            resolved = give_back()
            answer = await apply(session, list(ending), *ended, unknown=True)
            if resolved is not None:
                await resolved.wait()
            return answer, None
        if result is None:  # neither applied
            return await apply(session, list(ending), *ended), None
        return "done", result

    def undo(got: tuple[Answer, tuple[Entry | None, ...] | None] | None) -> None:
        # The caller went away: nobody takes the job claimed for it.
        result = got[1] if got is not None else None
        if result is not None and result[-2] is not None and result[-1] is not None:
            release_soon(session, result[-2], header, pick.payload, result[-1])
        elif got is None:
            give_back()
        late(got[0] if got is not None else None)

    got = await session.settle(work, undo=undo, ending=True)  # (a close waits for it)
    if got is None:
        return None, None
    answer, result = got
    if result is None:
        return answer, None
    job, claimed = result[-2], result[-1]
    assert job is not None
    assert claimed is not None
    return answer, (_granted(name, session, pick, claimed, seq), job)


async def wait_for_change(
    backend: Backend,
    jobs: tuple[str, Listing],
    claims: tuple[str, Listing],
    wake_at: float | None,
) -> None:
    """Wait until something may have made a job claimable: a job created or deleted, a
    claim deleted (an unpark creates and deletes one), a backoff over. Returns
    spuriously after a lost history or an error (the caller reads again)."""
    jobs_prefix, job_listing = jobs
    claims_prefix, claim_listing = claims
    waits: list[Awaitable[None]] = [
        _first(backend, jobs_prefix, job_listing.revision, deletes_only=False),
        # Also the passing entry an unpark creates and deletes there.
        _first(backend, claims_prefix, claim_listing.revision, deletes_only=True),
    ]
    if wake_at is not None:
        waits.append(anyio.sleep(max(wake_at - time.time(), 0.0)))
    async with anyio.create_task_group() as tg:
        for wait in waits:
            tg.start_soon(_then_cancel, wait, tg.cancel_scope)


async def _then_cancel(wait: Awaitable[None], scope: anyio.CancelScope) -> None:
    try:
        await wait
    except (ResyncNeeded, SessionExpiredError, ClosedError):
        # Lost history: read again. A watch on a lost (or closed) session: the caller's
        # read tells it, raised as itself, not as a group of this wait's two watches.
        pass
    except BackendError:
        await _retry.backoff(2)  # the caller reads again, which tells what is wrong
    scope.cancel()


async def _first(backend: Backend, prefix: str, revision: int, *, deletes_only: bool) -> None:
    async with backend.watch(prefix, revision=revision) as changes:
        async for change in changes:
            if deletes_only and (
                change.kind is not ChangeKind.DELETE or _records.is_looker(change.entry.key)
            ):
                continue  # (a looker's presence that goes frees no job)
            return
