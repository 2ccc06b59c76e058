"""Removing jobs by hand: cancelling a queued job, purging dead letters.

**Cancel** deletes a queued job that no live claim holds, in one transaction guarded by
the job's version as read: a worker that claims the job meanwhile changes that version,
so the store refuses the delete, and the job is read again and decided again. So a cancel
never deletes a job a worker holds, and "claimed" and "not found" are said only on what
a read of the store showed. A job put with a ``job_id`` also loses its dedupe marker in
the same transaction, so that a later put of that id queues it again.

Finding the job: a job put with a ``job_id`` has the entry ``@j<digest>``
(:func:`coord._jobs.put._digest`), one put without has ``@j<id>``; a requeued dead letter
has a fresh entry name, with its id only in the header. So the direct names first (one
read each), then a scan of the queue comparing the headers.

**Purge** deletes dead letters (all, or those of some ids) in transactions of at most
``backend.max_ops`` removals, each guarded by the dead letter as read: one requeued or
purged by someone else meanwhile refuses its batch, which is read again.

Each transaction runs in a task of the session (:meth:`Session.settle`), which owns its
outcome: once sent, a cancelled caller still waits for the answer (up to the TTL), and a
request with no answer raises :exc:`coord.OutcomeUnknown`.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import TYPE_CHECKING, Literal

import anyio.lowlevel

from .._core.exceptions import BackendUnavailable, OutcomeUnknown, SessionExpiredError
from ..abc import Remove
from . import records as _records
from .put import _digest, check_job_id

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._sessions.session import SessionSource
    from ..abc import Backend, Entry, Op

__all__ = ["CancelOutcome", "Remover"]

#: What :meth:`coord.Queue.cancel` found and did.
CancelOutcome = Literal["cancelled", "claimed", "not found"]

_log = logging.getLogger("coord")

# The id that a put without a job_id gives its job (uuid4().hex), which names its entry.
_FRESH_ID = re.compile(r"[0-9a-f]{32}")
# Reads and tries of one cancel whose job keeps changing under it (claimed and given
# back): then it says it did not go through, nothing deleted.
_TRIES = 16


class Remover:
    """The operator's removals on one queue: cancel and purge."""

    def __init__(self, source: SessionSource, name: str) -> None:
        self._source = source
        self._name = name
        self._jobs = f"{name}/_jobs/"
        self._claims = f"{name}/_claims/"
        self._dead = f"{name}/_dead/"
        self._ids = f"{name}/_ids/"

    async def cancel(self, job_id: object) -> CancelOutcome:
        """Delete the queued job *job_id* unless a live claim holds it (see the module
        docstring)."""
        job_id = check_job_id(job_id)
        for _ in range(_TRIES):
            found = await self._find(job_id)
            if found is None:
                return "not found"
            entry, state = found
            if state.claim is not None and state.claim in await self._live_claims():
                return "claimed"
            ops: list[Op] = [Remove(entry)]
            marker = await self._source.read(partial(_find, self._ids, f"@t{_digest(job_id)}"))
            if marker is not None:
                ops.append(Remove(marker))
            if await self._write(ops, "cancel", job_id):
                return "cancelled"
            # Refused: the job (or its marker) changed since it was read: again.
        raise BackendUnavailable(
            f"queue {self._name!r}: the cancel of job {job_id!r} did not go through in "
            f"{_TRIES} tries (the job kept changing under it); nothing was cancelled"
        )

    async def _find(self, job_id: str) -> tuple[Entry, _records.State] | None:
        """The queued job *job_id*: by its entry's name, else by a scan of the queue."""
        names = [f"@j{_digest(job_id)}"]
        if _FRESH_ID.fullmatch(job_id):
            names.append(f"@j{job_id}")
        for waiter in names:
            entry = await self._source.read(partial(_find, self._jobs, waiter))
            if entry is not None:
                state, _ = _records.decode(entry)
                if state.id == job_id:
                    return entry, state
        for entry in (await self._source.read(lambda b: b.entries(self._jobs))).entries:
            state, _ = _records.decode(entry)
            if state.id == job_id:
                return entry, state
        return None

    async def _live_claims(self) -> set[str]:
        claims = await self._source.read(lambda b: b.entries(self._claims))
        return {_records.id_of(e.key) for e in claims.entries}

    async def purge(self, job_ids: Iterable[str] | None) -> int:
        """Delete the dead letters (of *job_ids*, or all); how many this call deleted."""
        wanted = _check_ids(job_ids)
        if wanted is not None and not wanted:
            return 0
        removed = 0
        batch_size = self._source.backend.max_ops
        while True:
            letters = (await self._source.read(lambda b: b.entries(self._dead))).entries
            doomed = [e for e in letters if wanted is None or _records.decode(e)[0].id in wanted]
            refused = False
            for start in range(0, len(doomed), batch_size):
                batch = doomed[start : start + batch_size]
                try:
                    done = await self._write([Remove(e) for e in batch], "purge", None)
                except OutcomeUnknown as exc:
                    raise OutcomeUnknown(
                        f"{exc} ({removed} dead letters were purged before it)",
                        operation="purge",
                    ) from exc
                if done:
                    removed += len(batch)
                refused = refused or not done
            if not refused:  # else some were gone already: read again, purge the rest
                return removed

    async def _write(self, ops: list[Op], operation: str, job_id: str | None) -> bool:
        """Apply *ops* in a task of the session: True if done, False if refused (a
        guard failed: nothing written).

        :raises OutcomeUnknown: if it was sent and no answer came
        """
        # A caller cancelled while an earlier write was waited for (shielded) stops
        # here, before sending more.
        await anyio.lowlevel.checkpoint_if_cancelled()
        session = await self._source.live()
        backend = session.backend
        what = f"the {operation} of job {job_id!r}" if job_id else f"a {operation}"

        async def run() -> tuple[tuple[Entry | None, ...] | None]:
            return (await backend.transact(ops),)

        def late(answer: tuple[tuple[Entry | None, ...] | None] | None) -> None:
            said = "unknown" if answer is None else "refused" if answer[0] is None else "done"
            _log.warning(
                "queue %r: %s, whose caller did not wait for its answer: %s",
                self._name,
                what,
                said,
            )

        try:
            # An ending: the client's close waits for its answer (up to the TTL).
            answer = await session.settle(run, undo=late, ending=True)
        except (BackendUnavailable, SessionExpiredError) as exc:
            raise self._unknown(what, operation, job_id, exc) from exc
        if answer is None:  # no answer within the TTL: logged when it comes
            raise self._unknown(what, operation, job_id, None)
        return answer[0] is not None

    def _unknown(
        self, what: str, operation: str, job_id: str | None, exc: BaseException | None
    ) -> OutcomeUnknown:
        why = f" ({exc})" if exc is not None else " in time"
        return OutcomeUnknown(
            f"queue {self._name!r}: {what} was sent and no answer came{why}: it may have "
            "been applied",
            operation=operation,
            job_id=job_id,
        )


async def _find(prefix: str, waiter: str, backend: Backend) -> Entry | None:
    return await backend.find(prefix, waiter, None)


def _check_ids(job_ids: object) -> set[str] | None:
    if job_ids is None:
        return None
    if isinstance(job_ids, str | bytes):
        raise TypeError("job_ids must be an iterable of job ids (a str is one id: [job_id])")
    try:
        ids = list(job_ids)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"job_ids must be None or an iterable of str, not {type(job_ids).__name__}"
        ) from None
    return {check_job_id(i) for i in ids}
