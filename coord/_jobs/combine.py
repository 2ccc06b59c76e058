"""Combining one client's puts: fresh jobs put at once go to the store together.

A put of a fresh job (no ``job_id``) is one create. The puts of one client to one queue
that come while a transaction of them is out wait, and go together when its answer
comes (up to :data:`BATCH_JOBS` jobs, and a share of the store's request limit), as
``put_many``'s batches do: a store takes one transaction of eight creates for about the
cost of one create, so eight putters of a client put several times faster than with a
transaction each. A put that finds nothing in flight goes at once: there is no timer.
A second transaction goes out before the first answer only with a full batch (under a
load of more than :data:`BATCH_JOBS` puts a round trip): sent at once, the first put to
come after an answer would go alone, and the others with the next answer, in turn,
which halved the batches of eight putters (etcd, A/B in the same minutes:
3,655-4,890 puts/s before, 5,903-6,348 after). For the same reason the answer's sender
lets the putters it woke run (their next puts join the waiting batch) before it sends
the next transaction. The jobs of one transaction are queued in the order of their puts
(their ids sort so: see :meth:`coord.abc.Backend.transact`).

Each put is still told its own outcome, as :meth:`coord.Queue.put` says:

* **done**: its :class:`coord.JobRef` (jobs of one transaction share a ``seq``);
* **not done**: the session was lost, or the client closed, before its transaction was
  sent (:exc:`coord.SessionExpiredError`, :exc:`coord.ClosedError`);
* **unknown**: its transaction was sent and no answer came within the session's TTL, or
  the store stopped answering: :exc:`coord.OutcomeUnknown`, naming its job.

A put **cancelled** while it waits for a transaction is taken out of it (nothing was
sent for it); one cancelled while its transaction is out stops waiting at once, and its
job is withdrawn once the transaction ends (:meth:`Putter._withdraw_soon`, as for any
cancelled put). The other puts of that transaction are not affected: the transaction is
sent and awaited by a task of the client, not by any of its callers.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .._core.background import declare_asyncio
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    OutcomeUnknown,
    SessionExpiredError,
)
from ..abc import Create
from . import records as _records

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._sessions.session import SessionSource
    from ..abc import Entry
    from .records import State

    #: Withdraw the job of a put whose caller is gone: its entry id, and its entry as
    #: made (None: the outcome is unknown).
    Withdraw = Callable[[str, Entry | None], None]
    #: The error telling a put's outcome unknown: its job id, and why.
    Unknown = Callable[[str, BaseException | None], OutcomeUnknown]

__all__ = ["BATCH_JOBS", "IN_FLIGHT", "Combiner", "batch_limit", "combiner_for", "job_room"]

#: Transactions of one client's puts to one queue out at once. The second goes only with
#: a full batch (:data:`BATCH_JOBS` jobs, or the share of the request limit): else the
#: puts that come while one is out wait for its answer, and go together.
IN_FLIGHT = 2
#: The most jobs put in one transaction: a transaction takes at most 64 operations on
#: every store (etcd's default ``--max-txn-ops`` is 128 compares; a Create is one).
BATCH_JOBS = 64
# Room per job beyond its key and value in the request (the store's framing, the
# namespace), and the share of the store's request limit a batch may take: a
# conservative bound, so that no batch can be refused on size.
_JOB_ROOM = 1024
_SHARE = 3 / 4


def batch_limit(source: SessionSource) -> int:
    """The most bytes of jobs (see :func:`job_room`) one transaction of puts takes."""
    return int(source.backend.max_request_size * _SHARE)


def job_room(jobs: str, data: bytes, key: str | None) -> int:
    """The room a job takes in a transaction of puts to the prefix *jobs*, at most."""
    return len(data) + len(jobs) + len(key or "") * 4 + _JOB_ROOM * 2


class _Put:
    """One put waiting for its transaction, and what it is told."""

    __slots__ = ("data", "done", "entry", "error", "gone", "job_id", "key", "sent", "state")

    def __init__(self, data: bytes, key: str | None, state: Callable[[str], State]) -> None:
        self.data = data
        self.key = key
        self.state = state  # its header, given its id
        self.job_id = ""  # given when its transaction is made (ids sorting in put order)
        self.done = anyio.Event()
        self.entry: Entry | None = None
        self.error: BaseException | None = None
        self.sent = False  # its transaction was sent: its outcome may be unknown
        self.gone = False  # its caller stopped waiting (cancelled)


class Combiner:
    """The puts of fresh jobs of one client to one queue (see the module docstring)."""

    def __init__(
        self, source: SessionSource, jobs: str, withdraw: Withdraw, unknown: Unknown
    ) -> None:
        self._source = source
        self._jobs = jobs
        self._withdraw = withdraw
        self._unknown = unknown
        self._waiting: deque[_Put] = deque()
        self._out = 0

    async def put(
        self, data: bytes, key: str | None, state: Callable[[str], State]
    ) -> _records.JobRef:
        """Queue one fresh job (``state(job_id)`` its header), in the next transaction
        of this client's puts. A checkpoint; see the module docstring for its outcomes
        and its cancellation."""
        # A client that is not open, or runs no sessions, says so here (not done); the
        # transaction waits for a live session all the same.
        await self._source.live()
        put = _Put(data, key, state)
        self._waiting.append(put)
        self._send_more()
        try:
            await put.done.wait()
        except BaseException:
            put.gone = True
            if put.done.is_set():  # its outcome came as it was cancelled: undo it
                if put.entry is not None:
                    self._withdraw(f"@j{put.job_id}", put.entry)
                elif isinstance(put.error, OutcomeUnknown):
                    self._withdraw(f"@j{put.job_id}", None)
            elif not put.sent:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(put)
            raise
        if put.error is not None:
            raise put.error
        assert put.entry is not None
        return _records.JobRef(put.job_id, key, put.entry.revision)

    def _send_more(self, *, answered: bool = False) -> None:
        """Send the puts waiting, as long as fewer than :data:`IN_FLIGHT` transactions
        are out: with one out, only a full batch, unless an answer just came
        (*answered*: the puts woken by it have had their turn to join)."""
        while self._waiting and self._out < IN_FLIGHT:
            if self._out and not answered and not self._full():
                return  # they go with the next answer, together
            batch = self._take()
            self._out += 1
            try:
                self._source.spawn(partial(self._send, batch), ending=True)
            except Exception as exc:  # the client is closing: nothing was sent
                self._out -= 1
                self._tell(batch, error=exc)

    def _full(self) -> bool:
        """Whether the puts waiting make a whole transaction: the next one cannot take
        more (see :meth:`_next_count`)."""
        count = self._next_count()
        return count == BATCH_JOBS or count < len(self._waiting)

    def _next_count(self) -> int:
        """How many of the puts waiting, oldest first, the next transaction takes: at
        most BATCH_JOBS, within the share of the store's request limit (one at least,
        whatever its size)."""
        limit = batch_limit(self._source)
        count = size = 0
        for put in self._waiting:
            room = job_room(self._jobs, put.data, put.key)
            if count == BATCH_JOBS or (count and size + room > limit):
                break
            count += 1
            size += room
        return count

    def _take(self) -> list[_Put]:
        """The puts of the next transaction, oldest first (:meth:`_next_count` of them)."""
        return [self._waiting.popleft() for _ in range(self._next_count())]

    async def _send(self, batch: list[_Put]) -> None:
        """One transaction creating the jobs of *batch*, each put told its outcome."""
        declare_asyncio()  # (a task of the combiner's own)
        try:
            batch = [put for put in batch if not put.gone]  # cancelled meanwhile
            if batch:
                await self._commit(batch)
        except Exception as exc:  # not sent (the client closes: no session), or refused
            self._tell(batch, error=exc)
        except BaseException:  # cancelled with the client: unknown if it was sent
            self._tell(batch, error=ClosedError("the client closed"))
            raise
        finally:
            try:
                # The putters this answer woke run first: their next puts join the batch.
                # Twice: trio runs the tasks woken at once in a random order (it reverses
                # a batch at random), this one among them.
                await anyio.lowlevel.cancel_shielded_checkpoint()
                await anyio.lowlevel.cancel_shielded_checkpoint()
            finally:
                self._out -= 1
                self._send_more(answered=True)

    async def _commit(self, batch: list[_Put]) -> None:
        session = await self._source.live()
        batch = [put for put in batch if not put.gone]  # cancelled while it waited
        if not batch:
            return
        try:
            session.check()  # a session lost before anything is sent: not done
        except SessionExpiredError as exc:
            self._tell(batch, error=exc)
            return
        base = uuid.uuid4().hex[:26]  # ids sorting in put order (see Backend.transact)
        ops = []
        for n, put in enumerate(batch):
            put.job_id = f"{base}{n:06x}"
            value = _records.encode(put.state(put.job_id), put.data)
            ops.append(Create(self._jobs, f"@j{put.job_id}", value))
        for put in batch:
            put.sent = True
        answer: tuple[Entry | None, ...] | None = None
        cause: BaseException | None = None
        with anyio.move_on_after(session.ttl):
            try:
                answer = await session.backend.transact(ops)
            except (BackendUnavailable, SessionExpiredError) as exc:
                cause = exc
            except BackendError as exc:  # the store's answer: refused (not done)
                for put in batch:
                    put.sent = False
                self._tell(batch, error=exc)
                return
            else:
                if answer is None:  # refused: an entry id taken (fresh ids: never)
                    for put in batch:
                        put.sent = False
                    self._tell(batch, error=BackendError(self._refused(len(batch))))
                    return
        if answer is None:  # no answer, or none in time
            self._tell(batch, cause=cause)
            return
        for put, entry in zip(batch, answer, strict=True):
            put.entry = entry
            if put.gone:  # cancelled while its transaction was out: withdraw its job
                self._withdraw(f"@j{put.job_id}", entry)
            put.done.set()

    def _tell(
        self,
        batch: list[_Put],
        *,
        error: BaseException | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """End the puts of *batch* not yet told: with *error* if it was not sent (not
        done), else unknown (the job of a put whose caller is gone is withdrawn if it
        was made)."""
        for put in batch:
            if put.done.is_set():
                continue
            if error is not None and not put.sent:
                put.error = error
            else:
                put.error = self._unknown(put.job_id, cause)
                if cause is not None:
                    put.error.__cause__ = cause
                if put.gone:
                    self._withdraw(f"@j{put.job_id}", None)
            put.done.set()

    def _refused(self, n: int) -> str:
        prefix = self._jobs.removesuffix("/_jobs/")
        return (
            f"queue {prefix!r}: the store refused a transaction of {n} new jobs (an "
            "entry id was taken): none of them was queued"
        )


_COMBINERS: weakref.WeakKeyDictionary[SessionSource, dict[str, Combiner]] = (
    weakref.WeakKeyDictionary()
)


def combiner_for(
    source: SessionSource, jobs: str, withdraw: Withdraw, unknown: Unknown
) -> Combiner:
    """The combiner of *source*'s (a client's) puts to the jobs prefix *jobs* of a queue:
    one per client and queue, shared by every :class:`coord.Queue` object of that name
    on it (the first one's *withdraw* and *unknown*: those of any are the same)."""
    combiners = _COMBINERS.setdefault(source, {})
    combiner = combiners.get(jobs)
    if combiner is None:
        combiner = combiners[jobs] = Combiner(source, jobs, withdraw, unknown)
    return combiner
