"""Queue: durable jobs, handed out in order, one live worker per job, fenced acks.

Layout under the queue's name ``N``:

* ``N/_jobs/@j<id>``: one durable entry per job (bound to no lease), in put order;
  its value is a small header (key, attempt, backoff, parked, current claim) and the
  payload (:mod:`coord._jobs.records`);
* ``N/_claims/@c<id>``: one entry per claim, bound to the worker's lease, so that a dead
  worker's claims go with its session and the jobs can be claimed again; beside them,
  ``N/_claims/@l<id>`` names a client's looker while it contends with others (no job's
  claim: :meth:`coord._jobs.looker.Looker._contended`);
* ``N/_dead/@j<id>``: the dead-letter list (option ``on_exhausted="dead_letter"``);
* ``N/_ids/@t<digest>``: a marker per job put with a ``job_id``, for ``dedupe_window``
  (:mod:`coord._jobs.put`);
* ``N/_idle/@…``: the idle lookers (one per client with idle workers), of which the
  first two watch the queue (:mod:`coord._jobs.looker`).

Every put, claim, ack and nack is one consensus write (a transaction); the ack and nack
are guarded by the claim (its entry must still exist) and by the job's version, so a
worker whose claim was lost or taken over can never ack or nack the job.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._core import keys as _keys
from .._core import own_cancel
from .._core.checks import (
    check_bool,
    check_duration,
    check_int,
    check_seconds,
    check_str,
    check_type,
)
from .._core.exceptions import ConfigurationError, JobNotFound, JobTimeout
from ..abc import Create, Remove, Update
from . import records as _records
from .batch import Planned, put_many
from .endings import Exhausted, RetryPolicy, end_claim
from .looker import looker_for
from .put import Options, Putter, check_job_id, check_options
from .records import DeadLetter, Job, JobRef, NewJob
from .removing import Remover
from .worker import Carry, RunStats, check_run, run_workers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable
    from types import TracebackType
    from typing import Literal

    from .._sessions.session import SessionSource
    from ..abc import Op
    from .commit import Answer
    from .endings import Then
    from .removing import CancelOutcome

__all__ = ["Claiming", "Exhausted", "Job", "KeyStats", "Queue", "QueueStats"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class KeyStats:
    """One key's jobs (see :attr:`QueueStats.keys`).

    :ivar depth: its jobs outstanding
    :ivar in_flight: those claimed by a worker now
    :ivar parked: those parked (waiting for :meth:`Queue.unpark`)
    """

    depth: int = 0
    in_flight: int = 0
    parked: int = 0


@dataclass(frozen=True)
class QueueStats:
    """The queue as read at one moment (``await queue.stats()``).

    :ivar depth: jobs outstanding (put, not yet acked or dead-lettered)
    :ivar in_flight: jobs claimed by a live worker now
    :ivar parked: jobs parked after their last attempt (their key waits)
    :ivar dead: dead letters
    :ivar keys: the same, per job key (jobs without a key are not listed)
    """

    depth: int
    in_flight: int
    parked: int
    dead: int
    keys: dict[str, KeyStats] = field(default_factory=dict)


class Queue:
    """A durable job queue with per-key order, claims bound to the worker's session,
    and fenced acks. Made by :meth:`coord.Client.queue`.

    Example::

        queue = client.queue("emails")
        await queue.put(b'{"to": "a@example.com"}', key="customer-7")
        async with queue.claim() as job:       # the oldest claimable job
            await send(job.payload, idempotency_key=job.fence)
        # a normal exit acks (deletes) it; an exception releases it for a retry in place

    Jobs with the same key run one at a time, in put order; different keys in parallel;
    jobs without a key are handed out in put order. A claim lives on the worker's
    session: if the worker dies or is cut off, the job becomes claimable again at the
    head of its key, and a worker that was only paused finds its body cancelled with
    :exc:`coord.ClaimLost` and its ack refused.

    For operators: :meth:`cancel` deletes a queued job that no worker holds,
    :meth:`dead_letters`, :meth:`requeue` and :meth:`purge` handle the dead letters,
    :meth:`unpark` lets a parked key go on, and :meth:`stats` counts.

    :param max_attempts: attempts before a job is parked or dead-lettered
    :param on_exhausted: ``"park"`` (the job stays at the head of its key, which waits
        for :meth:`unpark`: order is kept) or ``"dead_letter"`` (it moves to
        :meth:`dead_letters` and its key goes on: order is broken for it, as with SQS)
    :param retry_delay: backoff before the first retry, doubling up to *max_retry_delay*
        (read from the wall clock: workers' clocks should roughly agree)
    :param dedupe_window: seconds after a put with a ``job_id`` during which a put of
        the same id queues nothing (see :meth:`put`; wall clock)
    :param timeout: seconds a claim's body may run before it is cancelled and the
        attempt counted as failed (:exc:`coord.JobTimeout`), for jobs put without a
        ``timeout`` of their own; None: no limit
    :param priorities: this queue's jobs may have a priority (``put(..., priority=)``):
        a worker's client then reads every outstanding job at each look, to find the
        highest priority, where it otherwise reads the oldest few. Producers and
        workers of such a queue should all open it so
    """

    def __init__(
        self,
        source: SessionSource,
        name: str,
        *,
        max_attempts: int = 5,
        on_exhausted: Exhausted = "park",
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
        dedupe_window: float = 600.0,
        timeout: float | None = None,
        priorities: bool = False,
    ) -> None:
        self._source = source
        self._name = _keys.check_name(name)
        _check_options(max_attempts, on_exhausted, retry_delay, max_retry_delay)
        self._timeout = None if timeout is None else check_duration(timeout, "timeout")
        self._priorities = check_bool(priorities, "priorities")
        self._putter = Putter(source, name, check_duration(dedupe_window, "dedupe_window"))
        self._remover = Remover(source, name)
        self._max_attempts = max_attempts
        self._on_exhausted = on_exhausted
        self._retry_delay = float(retry_delay)
        self._max_retry_delay = float(max_retry_delay)
        self._jobs = f"{name}/_jobs/"
        self._claims = f"{name}/_claims/"
        self._dead = f"{name}/_dead/"
        self._retry = RetryPolicy(
            max_attempts, on_exhausted, float(retry_delay), float(max_retry_delay), self._dead
        )

    def __repr__(self) -> str:
        return f"<coord.Queue {self._name!r} max_attempts={self._max_attempts}>"

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_payload_size(self) -> int:
        """The largest payload :meth:`put` takes on this store, in bytes: the store's value
        limit less the room kept for the job's header as stored (its key, attempt,
        backoff, claim and last failure message, cut to fit), so that every claim,
        retry, park and dead letter of the job fits too."""
        return _records.max_payload(self._source.backend.max_value_size)

    # -- producers ------------------------------------------------------------------------

    async def put(
        self,
        payload: bytes,
        *,
        key: str | None = None,
        job_id: str | None = None,
        priority: int = 0,
        delay: float | None = None,
        not_before: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  (the job's, stored: not this call's)
    ) -> JobRef:
        """Append a job. A checkpoint; one consensus write (with a *job_id*: also a read
        or two, to find an earlier put of that id).

        It ends one of three ways. Done: it returns the job (:class:`coord.JobRef`).
        Not done: it raises TypeError or ConfigurationError (nothing was written), or
        SessionExpiredError before anything was sent. Unknown: it raises
        :exc:`coord.OutcomeUnknown` (with the job's id) when the request was sent and no
        answer came: the job may be queued, and nothing deletes it behind your back.

        With a *job_id* the put can be repeated safely: while a job of that id is queued
        or in flight, and for the queue's ``dedupe_window`` after its put, a put of the
        same id queues nothing and returns that job. So the answer to OutcomeUnknown is
        to put again with the same *job_id*.

        If cancelled, the job is not queued: one whose request reached the store anyway
        is withdrawn by the client (across sessions, while it is open), unless a worker
        claimed it first; then it runs, and a WARNING (logger ``coord``) names it.

        :param key: jobs with the same key run one at a time, in put order
        :param job_id: the job's id (any printable string up to 256 characters), making
            the put repeatable; default: a fresh id
        :param priority: among the claimable jobs, higher priorities are claimed first
            (then the oldest); per-key order holds whatever the priorities. An int from
            -(2**31 - 1) to 2**31 - 1; other than 0 only on a queue opened with
            ``priorities=True`` (its workers too)
        :param delay: seconds from now before the job can be claimed (read from the wall
            clock, like *not_before*). A delayed job at the head of its key holds the
            key's later jobs until it has run
        :param not_before: a wall-clock time (as :func:`time.time` gives) before which
            the job cannot be claimed; not with *delay*
        :param timeout: seconds its claim's body may run: past it, the body is
            cancelled, the attempt counts as failed and the block raises
            :exc:`coord.JobTimeout`; default: the queue's ``timeout``
        :raises TypeError: for a payload that is not bytes, a key or job id that is
            not a str, or an option of the wrong type (a bool is no priority)
        :raises ConfigurationError: for a payload larger than the store takes, a bad
            key or job id, a negative or non-finite delay or timeout, both *delay* and
            *not_before*, a priority out of range, or one other than 0 on a queue not
            opened with ``priorities=True``
        :raises OutcomeUnknown: if the request was sent and no answer came
        """
        key = _records.check_key(key)
        data = _records.check_payload(payload, self._source.backend.max_value_size)
        options = self._options(priority, delay, not_before, timeout)
        return await self._putter.put(data, key, job_id, options)

    async def put_many(self, jobs: Iterable[NewJob | bytes]) -> list[JobRef]:
        """Append many jobs, in order, one transaction per batch: a list of their
        :class:`coord.JobRef`, one per job, in order. A checkpoint.

        Each job is a :class:`coord.NewJob` (the arguments of :meth:`put`) or plain
        bytes (a payload). Every job is checked before anything is written. The list
        goes in batches that the store takes in one transaction (up to 64 jobs, well
        under the store's request size); the jobs of one batch share their ``seq``.
        Jobs with a ``job_id`` keep :meth:`put`'s dedupe (a job of that id queued, in
        flight, or put within the ``dedupe_window`` queues nothing, and its JobRef is
        returned): each is put alone, by :meth:`put`'s repeatable put, in its place.

        If a batch was sent and no answer came, it raises :exc:`coord.OutcomeUnknown`:
        its ``job_ids`` may be queued, its ``done`` (JobRefs) are queued, and the jobs
        after that batch were not sent. Any other error raised after some batches were
        queued says which in a note (``__notes__``); give the jobs a ``job_id`` to put
        the whole list again safely.

        If cancelled, none of its jobs stays queued: those it had queued are withdrawn
        by the client (those of a batch in flight once its request ends), unless a
        worker claimed one first: then it runs, and a WARNING (logger ``coord``) names
        it.

        :raises TypeError: for a job that is neither a NewJob nor bytes, or a bad
            argument in one (as :meth:`put`)
        :raises ConfigurationError: for a bad value in a job (as :meth:`put`)
        :raises OutcomeUnknown: if a batch was sent and no answer came
        """
        limit = self._source.backend.max_value_size
        planned = []
        for n, job in enumerate(jobs):
            if isinstance(job, bytes | bytearray | memoryview):
                job = NewJob(bytes(job))
            check_type(job, NewJob, f"put_many: job {n}", "a coord.NewJob or bytes")
            data = _records.check_payload(job.payload, limit)
            key = _records.check_key(job.key)
            job_id = None if job.job_id is None else check_job_id(job.job_id)
            options = self._options(job.priority, job.delay, job.not_before, job.timeout)
            planned.append(Planned(data, key, job_id, options))
        if not planned:
            return []
        return await put_many(self._putter, planned)

    def _options(
        self, priority: object, delay: object, not_before: object, timeout: object
    ) -> Options:
        options = check_options(priority, delay, not_before, timeout)
        if options.priority and not self._priorities:
            raise ConfigurationError(
                f"queue {self._name!r}: a put with a priority needs the queue opened with "
                f"client.queue({self._name!r}, priorities=True), by its producers and its "
                "workers (their clients then read every outstanding job at each look)"
            )
        return options

    # -- workers --------------------------------------------------------------------------

    def claim(self) -> Claiming:
        """``async with queue.claim() as job:`` waits for the oldest claimable job and
        claims it (see :class:`Queue`). Waiting is a checkpoint, woken by watches. If
        cancelled while waiting, nothing is claimed. On exit: acked if the body ended
        normally; released for a retry (attempt + 1, after a backoff) if it raised;
        released as it was if it was cancelled from outside; a failed attempt if it ran
        past the job's timeout (its body cancelled).

        :raises ClaimLost: from the block, if the claim was lost while it ran (its body
            was cancelled) or its ack was refused
        :raises JobTimeout: from the block, if its body ran past the job's timeout (put's
            ``timeout``, else the queue's) and was cancelled
        """
        return Claiming(self)

    async def run(
        self,
        handler: Callable[[Job], Awaitable[object]],
        *,
        concurrency: int = 1,
        grace: float = 30.0,
        signals: Iterable[int] = (signal.SIGTERM,),
    ) -> RunStats:
        """Run *concurrency* workers, each ``async with queue.claim() as job: await
        handler(job)`` in a loop, until a signal or a cancellation; then drain them.

        Each job ends as its claim block does (see :meth:`claim`): acked if the handler
        returns, retried, parked or dead-lettered if it raises, given back by
        ``job.defer()``. A handler's exception never ends the loop: it is logged
        (logger ``coord``, WARNING with its traceback, the job's id and attempt and
        what became of the job), and so is a lost claim (:exc:`coord.ClaimLost`). A
        handler cancelled natively and not by coord (asyncio: its task cancelled itself,
        or it awaited a cancelled task) fails its attempt the same way (a RuntimeError
        saying so), and its worker goes on.

        A worker acks its job and claims its next one in one transaction when it can
        (the claim fails alone if another worker had that job first, and the ack then
        goes alone): one request to the store a job, where a ``claim()`` loop makes two.
        A job claimed so and not yet handled when the loop stops is given back as it was.

        The drain, on cancellation or one of *signals*: no job is claimed any more (a
        worker waiting for one stops waiting), the handlers in flight have *grace*
        seconds to finish, and those still running are then cancelled: their jobs are
        given back as they were, no attempt counted, for another worker (a WARNING
        names each). After a signal it returns the :class:`coord.RunStats`; a
        cancellation (anyio, or asyncio's ``task.cancel()`` and ``asyncio.timeout``)
        is raised again once the drain is over. Logs an INFO line at the start and one
        with the counts at the end. A checkpoint.

        :param handler: ``async def handler(job: coord.Job) -> None``
        :param concurrency: how many jobs run at once
        :param grace: seconds the handlers in flight have to finish at the drain
            (``math.inf``: all the time they need; 0: cancelled at once)
        :param signals: signals that drain the loop (SIGTERM by default); handled only
            in the main thread, and ``()`` handles none
        :raises TypeError: if *handler* is not callable, or an argument has the wrong
            type (at the call: nothing is claimed)
        :raises ConfigurationError: for a *concurrency* below 1 or a negative *grace*
            (at the call)
        :raises ClosedError: if the client closes while the workers wait for jobs
        :raises SessionExpiredError: if the session is lost and none will follow
        """
        concurrency, seconds, numbers = check_run(handler, concurrency, grace, signals)
        return await run_workers(
            self._name,
            partial(Claiming, self),
            self._retry,
            handler,
            concurrency=concurrency,
            grace=seconds,
            signals=numbers,
        )

    async def _claim(self) -> Job:
        looker = looker_for(self._source, self._name)
        if self._priorities:
            looker.priorities = True  # for the looker's life: shared by every Queue object
        return await looker.next(self._retry)

    # -- operators ------------------------------------------------------------------------

    async def dead_letters(self) -> list[DeadLetter]:
        """The dead-letter list, oldest first. A checkpoint; one read."""
        letters = []
        for entry in (await self._source.read(lambda b: b.entries(self._dead))).entries:
            state, payload = _records.decode(entry)
            letters.append(
                DeadLetter(state.id, state.key, payload, state.attempt, state.error, entry.revision)
            )
        return letters

    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel the queued job *job_id*: delete it, unless a worker holds it now.
        A checkpoint; a few reads, then one consensus write.

        Returns ``"cancelled"`` (deleted: no worker will claim it; a parked job, or one
        backing off before a retry, is queued and is cancelled too), ``"claimed"`` (a
        live claim holds it: nothing was changed, the worker goes on and acks it), or
        ``"not found"`` (no queued job has that id: never put, already acked, or a dead
        letter, which :meth:`purge` removes). Each answer rests on what a read of the
        store showed: the delete is guarded by the job's version as read, so a worker
        that claims the job meanwhile makes the store refuse it, and the job is read
        again. Cancelling the job at the head of its key lets the key's next job be
        claimed at once (the idle workers are woken).

        A job put with a ``job_id`` loses its dedupe marker in the same transaction: a
        later :meth:`put` of that id queues it again, within the ``dedupe_window`` too.

        If cancelled before the write is sent, nothing was cancelled; once sent, the
        call waits for its answer (up to the TTL) and returns it, the cancellation
        taking effect at the next checkpoint.

        :raises TypeError: if *job_id* is not a str
        :raises ConfigurationError: if *job_id* is not a valid id (empty, too long, not
            printable); nothing was read or written
        :raises OutcomeUnknown: if the delete was sent and no answer came: the job may
            have been cancelled (``exc.job_id``; cancel again: ``"not found"`` then
            means it is gone, by this cancel or by a worker's ack)
        """
        return await self._remover.cancel(job_id)

    async def purge(self, job_ids: Iterable[str] | None = None) -> int:
        """Delete dead letters: all of them, or those with one of *job_ids*. Returns how
        many this call deleted (a dead letter already gone, requeued or purged by
        someone else, is not counted and is no error). A checkpoint; one read, then one
        consensus write per :attr:`coord.abc.Backend.max_ops` dead letters (again for
        the rest when one of a batch was gone).

        :raises TypeError: if *job_ids* is not None or an iterable of str (a single str
            too: pass ``[job_id]``)
        :raises ConfigurationError: for an id that is not valid (nothing is written)
        :raises OutcomeUnknown: if a batch was sent and no answer came (its message
            says how many were purged before it)

        If cancelled, the batches answered before are deleted and the rest are not; a
        batch already sent is waited for (up to the TTL) before the cancellation takes
        effect.
        """
        return await self._remover.purge(job_ids)

    async def requeue(self, job_id: str) -> JobRef:
        """Put a dead letter back as a new job (at the end of the queue and of its key,
        attempt 0), in one transaction. A checkpoint.

        :raises JobNotFound: if there is no dead letter with that id
        :raises TypeError: if *job_id* is not a str
        """
        check_str(job_id, "job_id")
        backend = self._source.backend
        for entry in (await self._source.read(lambda b: b.entries(self._dead))).entries:
            state, payload = _records.decode(entry)
            if state.id != job_id:
                continue
            # A new job: attempt 0, no delay; its priority and timeout as put.
            fresh = _records.State(
                id=job_id, key=state.key, priority=state.priority, timeout=state.timeout
            )
            ops: list[Op] = [
                Remove(entry),
                # A fresh entry id (the job keeps its id, in the header).
                Create(self._jobs, f"@j{uuid.uuid4().hex}", _records.encode(fresh, payload)),
            ]
            done = await backend.transact(ops)
            if done is not None and done[1] is not None:
                return JobRef(job_id, state.key, done[1].revision)
        raise JobNotFound(f"queue {self._name!r} has no dead letter {job_id!r}")

    async def unpark(self, key: str | None) -> int:
        """Let the parked jobs of *key* (None: parked jobs without a key) be claimed
        again, attempt 0. Returns how many were unparked. A checkpoint.

        :raises TypeError: if *key* is neither a str nor None
        """
        key = _records.check_key(key)
        backend = self._source.backend
        unparked = 0
        while True:
            refused = 0
            for entry in (await self._source.read(lambda b: b.entries(self._jobs))).entries:
                state, payload = _records.decode(entry)
                if (
                    state.key != key
                    or not state.parked
                    or (state.error or "").startswith("not a job")
                ):
                    continue
                fresh = state.with_(parked=False, attempt=0, not_before=0.0, claim=None)
                # With a passing entry among the claims: its deletion wakes the worker
                # watching the queue (a watch reports creations and deletions only). On
                # our lease, deleted by a task of the session: it cannot stay behind.
                session = await self._source.live()
                nudge = Create(self._claims, f"@c{uuid.uuid4().hex}", lease=session.lease)
                done = await backend.transact(
                    [Update(entry, _records.encode(fresh, payload)), nudge]
                )
                if done is not None and done[1] is not None:
                    session.discard(done[1])
                unparked += done is not None
                refused += done is None
            if not refused:
                return unparked

    async def stats(self) -> QueueStats:
        """Depth, in flight, parked, dead, and the same per key. A checkpoint; three
        reads (not one snapshot: the counts may be a moment apart)."""
        jobs = await self._source.read(lambda b: b.entries(self._jobs))
        claims = await self._source.read(lambda b: b.entries(self._claims))
        live = {_records.id_of(e.key) for e in claims.entries}
        dead = len((await self._source.read(lambda b: b.entries(self._dead))).entries)
        keys: dict[str, list[int]] = {}
        totals = [0, 0, 0]
        for entry in jobs.entries:
            state, _ = _records.decode(entry)
            counts = (1, int(state.claim in live), int(state.parked))
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            if state.key is not None:
                per = keys.setdefault(state.key, [0, 0, 0])
                per[:] = [a + b for a, b in zip(per, counts, strict=True)]
        depth, in_flight, parked = totals
        per_key = {k: KeyStats(*v) for k, v in keys.items()}
        return QueueStats(depth, in_flight, parked, dead, per_key)


class Claiming:
    """A claim being made: what :meth:`Queue.claim` returns.

    Use it with ``async with queue.claim() as job:``: entering waits for the oldest
    claimable job and claims it (a :class:`coord.Job`); leaving acks it, or releases it
    for a retry if the body raised (see :meth:`Queue.claim`). Good for one block: call
    ``claim()`` again for the next job.
    """

    def __init__(self, queue: Queue, carry: Carry | None = None) -> None:
        self._queue = queue
        self._job: Job | None = None
        self._timeout: float | None = None
        # run()'s worker: its next job is claimed with this one's ack, and carried over.
        self._carry = carry

    def __repr__(self) -> str:
        return f"<coord.Queue.claim {self._queue.name!r} job={self._job!r}>"

    async def __aenter__(self) -> Job:
        if self._job is not None:
            raise RuntimeError("this claim() is already in use: call claim() again")
        carry = self._carry
        if carry is not None and carry.job is not None:
            job, carry.job = carry.job, None  # claimed with the last ack
        else:
            job = await self._queue._claim()
        self._job = job
        job._hold._enter_body()
        timeout = self._timeout = job._state.timeout or self._queue._timeout
        if timeout is not None:
            # The body's scope, cancelled on the claim's loss, also ends at the timeout.
            scope = job._hold._scope
            assert scope is not None
            scope.deadline = anyio.current_time() + timeout
        return job

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool:
        job = self._job
        assert job is not None
        hold = job._hold
        scope = hold._scope
        swallowed = hold._exit_body(exc_type, exc_val, exc_tb)
        if (
            not swallowed
            and self._carry is not None
            and isinstance(exc_val, asyncio.CancelledError)
            and scope is not None
            and scope.cancel_called
            and not own_cancel.by_scope()
        ):
            # run()'s handler took a cancellation of its own task and was then cut short
            # by this scope, which does not take a cancellation it did not make: both
            # are withdrawn, and the scope's is told (no other native cancellation
            # reaches a worker of run(): see coord._core.own_cancel). Shielded: a drain
            # coming meanwhile must not cut the claim's ending short.
            with anyio.CancelScope(shield=True):
                await own_cancel.withdraw()
            swallowed = True
        # The body's scope swallowed its own cancellation: the claim's loss (ClaimLost,
        # from end_claim), or else its deadline, the job's timeout.
        timed_out = (
            swallowed
            and self._timeout is not None
            and scope is not None
            and scope.deadline <= anyio.current_time()
            and not hold.lost
        )
        if timed_out:
            assert self._timeout is not None
            error = JobTimeout(
                f"job {job.id} ran past its timeout of {self._timeout:g} s: its body was "
                "cancelled, and the attempt counted as failed",
                job_id=job.id,
                timeout=self._timeout,
            )
            await end_claim(job, error, self._queue._retry)
            raise error from None
        exc = None if swallowed else exc_val
        await end_claim(job, exc, self._queue._retry, cut_short=swallowed, then=self._then(job))
        return swallowed

    def _then(self, job: Job) -> Then | None:
        """How to send *job*'s ack with the claim of the worker's next job, if the
        worker (``run()``'s) will claim again."""
        carry = self._carry
        if carry is None or not carry.wanted():
            return None
        looker = looker_for(self._queue._source, self._queue._name)
        hold = job._hold

        async def then(
            ack: list[Op], late: Callable[[Answer | None], None]
        ) -> Answer | Literal["unsent"] | None:
            answer, carry.job = await looker.ack_and_claim(
                hold.session, ack, (hold.entry, job._entry), late
            )
            return answer

        return then


def _check_options(
    max_attempts: object, on_exhausted: object, retry_delay: object, max_retry_delay: object
) -> None:
    if check_int(max_attempts, "max_attempts") < 1:
        raise ConfigurationError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
    if check_str(on_exhausted, "on_exhausted") not in ("park", "dead_letter"):
        raise ConfigurationError(
            f"on_exhausted must be 'park' or 'dead_letter', not {on_exhausted!r}"
        )
    for what, value in (("retry_delay", retry_delay), ("max_retry_delay", max_retry_delay)):
        if not check_seconds(value, what) >= 0:
            raise ConfigurationError(f"{what} must be a number of seconds >= 0, not {value!r}")
