"""Putting many jobs: one transaction per batch, each job's outcome told.

``put_many`` checks every job first (nothing is written on bad input), then puts the
list in order, in batches that the store takes in one transaction (at most
:data:`BATCH_JOBS` jobs, and a request well under the store's size limit). A batch
ends like a put: done (its jobs are queued), not done (an error raised before it was
sent), or unknown (:exc:`coord.OutcomeUnknown` naming its jobs, with the jobs of the
earlier batches, which are queued, in ``done``). The batches after it are not sent.

Jobs with a ``job_id`` keep :meth:`coord.Queue.put`'s dedupe: each is put alone, by
the repeatable put (a read of its marker, then a transaction creating the job and the
marker), in its place in the list: folding them into a batch would need every marker
read before the batch and a batch refused whole when one id was put meanwhile.

A batch's entry ids are made to sort in list order, which is what makes a
transaction's entries listed in the order of its Creates (:meth:`coord.abc.Backend.transact`),
so that the queue's order is the list's.

A **cancelled** put_many queued nothing it was not told of: the jobs it had created
(earlier batches, earlier repeatable puts) are withdrawn by the client, and those of a
batch in flight once its request ends, as for a cancelled put — unless a worker
claimed one first: then it runs, and a WARNING (logger ``coord``) names it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    OutcomeUnknown,
    SessionExpiredError,
)
from ..abc import Create
from . import records as _records
from .combine import BATCH_JOBS, batch_limit, job_room
from .put import Made, Options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..abc import Entry
    from .put import Putter

__all__ = ["BATCH_JOBS", "Planned", "put_many"]


@dataclass(frozen=True)
class Planned:
    """One job of a put_many, checked: its payload, key, id (None: a fresh one) and
    options."""

    data: bytes
    key: str | None
    job_id: str | None
    options: Options


async def put_many(putter: Putter, jobs: Sequence[Planned]) -> list[_records.JobRef]:
    """Put *jobs* in order (see the module docstring); their JobRefs, in order."""
    made: list[Made] = []
    refs: list[_records.JobRef] = []
    try:
        for group in _groups(putter, jobs):
            if isinstance(group, Planned):
                assert group.job_id is not None
                try:
                    refs.append(
                        await putter._put_repeatable(
                            group.data, group.key, group.job_id, group.options, made
                        )
                    )
                except OutcomeUnknown as exc:
                    raise _unknown(putter, [group.job_id], refs, exc) from exc
            else:
                refs += await _put_batch(putter, group, refs, made)
    except anyio.get_cancelled_exc_class():
        for job in made:  # queued, and the caller is not told: withdrawn
            putter._withdraw_soon(job.waiter, job.marker, job.entry, job.nonce)
        raise
    except BaseException as exc:
        if refs and not isinstance(exc, OutcomeUnknown):
            exc.add_note(
                f"put_many: the first {len(refs)} jobs were queued before this error "
                f"({', '.join(r.id for r in refs[:5])}{', ...' if len(refs) > 5 else ''}); "
                "the others were not"
            )
        raise
    return refs


def _groups(putter: Putter, jobs: Sequence[Planned]) -> list[Planned | list[Planned]]:
    """The list cut into batches of fresh jobs, and repeatable jobs one by one, in
    order."""
    limit = batch_limit(putter._source)
    groups: list[Planned | list[Planned]] = []
    batch: list[Planned] = []
    size = 0
    for job in jobs:
        if job.job_id is not None:
            if batch:
                groups.append(batch)
                batch, size = [], 0
            groups.append(job)
            continue
        room = job_room(putter._jobs, job.data, job.key)
        if batch and (len(batch) >= BATCH_JOBS or size + room > limit):
            groups.append(batch)
            batch, size = [], 0
        batch.append(job)
        size += room
    if batch:
        groups.append(batch)
    return groups


async def _put_batch(
    putter: Putter, batch: list[Planned], refs: list[_records.JobRef], made: list[Made]
) -> list[_records.JobRef]:
    """One transaction creating the jobs of *batch*: their JobRefs, or raise."""
    base = uuid.uuid4().hex[:26]  # ids sorting in list order (see Backend.transact)
    ids = [f"{base}{n:06x}" for n in range(len(batch))]
    states = [job.options.state(job_id, job.key) for job_id, job in zip(ids, batch, strict=True)]
    ops = [
        Create(putter._jobs, f"@j{state.id}", _records.encode(state, job.data))
        for state, job in zip(states, batch, strict=True)
    ]
    told: list[str] = []  # "unknown" once the caller is told so: then nothing is undone

    def undo(result: tuple[tuple[Entry | None, ...] | None] | None) -> None:
        # The caller went away (cancelled) while the request was out: withdraw what it
        # made (each job as made; or, outcome unknown, each job if never claimed).
        if told or (result is not None and result[0] is None):  # told, or refused
            return
        entries = result[0] if result is not None else None
        for n, op in enumerate(ops):
            putter._withdraw_soon(op.waiter_id, None, entries[n] if entries else None)

    async def create() -> tuple[tuple[Entry | None, ...] | None]:
        return (await session.backend.transact(ops),)

    session = await putter._source.live()
    session.check()  # a session lost before anything is sent: not done
    try:
        # Not shielded: a cancelled put_many stops waiting at once (and undo withdraws
        # whatever its request made, once it ends). An ending: the client's close waits
        # for its answer (up to the TTL), so it is told done, not unknown.
        answer = await session.settle(create, undo=undo, shield=False, ending=True)
    except (BackendUnavailable, SessionExpiredError) as exc:
        raise _unknown(putter, ids, refs, exc) from exc
    if answer is None:  # no answer within the TTL: it goes on without us
        told.append("unknown")
        raise _unknown(putter, ids, refs, None)
    if answer[0] is None:  # refused: an entry id taken (fresh ids: never in practice)
        raise BackendError(
            f"queue {putter._name!r}: the store refused a batch of {len(ids)} new jobs "
            "(an entry id was taken): none of them was queued"
        )
    done = []
    for job_id, job, op, entry in zip(ids, batch, ops, answer[0], strict=True):
        assert entry is not None
        done.append(_records.JobRef(job_id, job.key, entry.revision))
        made.append(Made(op.waiter_id, None, entry))
    return done


def _unknown(
    putter: Putter, ids: list[str], refs: list[_records.JobRef], exc: BaseException | None
) -> OutcomeUnknown:
    why = f" ({exc})" if exc is not None else " in time"
    return OutcomeUnknown(
        f"queue {putter._name!r}: put_many sent the put of {len(ids)} job(s) ({ids[0]}"
        f"{', ...' if len(ids) > 1 else ''}) and no answer came{why}: they may have been "
        f"queued; the {len(refs)} job(s) before them were (exc.done), the ones after them "
        "were not. Jobs with a job_id can be put again safely",
        operation="put_many",
        job_id=ids[0],
        job_ids=tuple(ids),
        done=tuple(refs),
    )
