"""The worker loop: ``await queue.run(handler, concurrency=n)``.

*n* workers each claim a job, run ``handler(job)`` in the claim's block and claim again,
so the claim's own endings hold: a normal return acks, an exception retries, parks or
dead-letters as the queue is configured, :meth:`coord.Job.defer` gives the job back, and
a lost claim raises :exc:`coord.ClaimLost`, which is logged. No handler's failure ends
the loop, nor does a handler's native cancellation (asyncio's ``task.cancel()`` of its
own task, :mod:`coord._core.own_cancel`): that fails its attempt (:meth:`_Workers._run`).
A worker that acks claims its next job in the same transaction when its client's looker
has one in stock (:func:`coord._jobs.claim.claim_with`): one request a job instead of
two; the job is carried to the worker's next claim (:class:`Carry`).

**The drain.** On cancellation of ``run()`` or one of its signals the loop stops
claiming at once (a worker waiting for a job stops waiting: the looker hands a job it
claimed meanwhile to another worker, or gives it back), lets the handlers in flight
finish within the grace, then cancels those still running: a cancelled claim block gives
its job back as it was, for another worker. The workers run in a task group inside a
shielded scope, hosted by a task of their own, and the caller's task drains them: an
outer cancellation cannot reach a handler before the grace is over, and neither can a
native asyncio ``task.cancel()`` (which an anyio shield does not stop, but which is
delivered to the caller's task, not to the workers').
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .._core import own_cancel
from .._core import retry as _retry
from .._core.background import declare_asyncio, undeclared
from .._core.checks import check_int, check_seconds
from .._core.exceptions import (
    ClaimLost,
    ClosedError,
    ConfigurationError,
    JobTimeout,
    SessionExpiredError,
)
from .endings import release_now

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from contextlib import AbstractAsyncContextManager
    from contextvars import Token

    from .endings import RetryPolicy
    from .records import Job

__all__ = ["Carry", "RunStats", "check_run", "run_workers"]

_log = logging.getLogger("coord")


@dataclass(frozen=True)
class RunStats:
    """What a worker loop did, as :meth:`coord.Queue.run` returns it after a signal
    (after a cancellation the same counts are logged).

    :ivar acked: jobs whose handler returned, acked
    :ivar failed: jobs whose handler raised, released for a retry, parked or
        dead-lettered as the queue is configured
    :ivar lost: claims lost while their handler ran (:exc:`coord.ClaimLost`)
    :ivar released: jobs given back as they were, no attempt counted: deferred
        (:meth:`coord.Job.defer`), or still running when the grace ended
    :ivar drained_in: seconds from the stop (the signal or the cancellation) to the
        end of the drain
    """

    acked: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    drained_in: float = 0.0


def check_run(
    handler: object, concurrency: object, grace: object, signals: object
) -> tuple[int, float, tuple[signal.Signals, ...]]:
    """The arguments of :meth:`coord.Queue.run`, checked: TypeError for a wrong type,
    ConfigurationError for a bad value."""
    if not callable(handler):
        raise TypeError(f"handler must be an async function, not {type(handler).__name__}")
    workers = check_int(concurrency, "concurrency")
    if workers < 1:
        raise ConfigurationError(f"concurrency must be an int >= 1, not {concurrency!r}")
    seconds = check_seconds(grace, "grace")
    if not seconds >= 0:  # (math.inf waits for every handler)
        raise ConfigurationError(f"grace must be a number of seconds >= 0, not {grace!r}")
    if isinstance(signals, str | bytes) or not isinstance(signals, Iterable):
        raise TypeError(f"signals must be a tuple of signal numbers, not {signals!r}")
    numbers = []
    for number in signals:
        if isinstance(number, bool) or not isinstance(number, int):
            raise TypeError(f"signals must be signal numbers, not {type(number).__name__}")
        try:
            numbers.append(signal.Signals(number))
        except ValueError:
            raise ConfigurationError(f"signals: {number} is not a signal number") from None
    return workers, seconds, tuple(numbers)


class Carry:
    """A worker's next job, claimed with the ack of its last one (one transaction, see
    :func:`coord._jobs.claim.claim_with`): the worker of ``run()`` claims again as soon
    as it has acked, unless it stops.

    :ivar job: the job claimed so, until the worker's next claim takes it
    """

    __slots__ = ("job", "wanted")

    def __init__(self, wanted: Callable[[], bool]) -> None:
        self.job: Job | None = None
        self.wanted: Callable[[], bool] = wanted  # whether the worker will claim again

    async def give_back(self) -> None:
        """Give back a job carried over that no claim will take (the worker stopped), as
        it was: no attempt counted. Waits for the store's answer (shielded, up to the
        TTL), so that the drain of ``run()`` ends with the job back: a client closed as
        soon as ``run()`` returns would otherwise revoke the claim first, and the job,
        which never ran, would count a lost attempt. A checkpoint if it holds a job."""
        job, self.job = self.job, None
        if job is not None:
            hold = job._hold
            hold._finish()
            try:
                await release_now(hold.session, job._entry, job._state, job.payload, hold.entry)
            finally:
                if job._given_back is not None:
                    job._given_back()


class _Slot:
    """One worker: the scope its claim runs in, the job it holds (None while it waits
    for one), the handler's own exception, if it raised, and its next job, if it was
    claimed with the last ack; and its task's declaration of asyncio to sniffio, which
    the handler runs without (``declare_asyncio``)."""

    __slots__ = ("carry", "declared", "failures", "job", "raised", "scope")

    def __init__(self, carry: Carry) -> None:
        self.declared: Token[str | None] | None = None
        self.failures = 0  # claims that failed in a row (see _claim_failed)
        self.scope: anyio.CancelScope | None = None
        self.job: Job | None = None
        self.raised: Exception | None = None
        self.carry = carry


class _Workers:
    """The workers of one ``run()``, their counts, and how they stop."""

    def __init__(
        self,
        name: str,
        claim: Callable[[Carry], AbstractAsyncContextManager[Job]],
        retry: RetryPolicy,
        handler: Callable[[Job], Awaitable[object]],
        concurrency: int,
    ) -> None:
        self.name = name
        self._claim = claim
        self._retry = retry
        self._handler = handler
        self._slots = [_Slot(Carry(self._claiming)) for _ in range(concurrency)]
        self.counts = {"acked": 0, "failed": 0, "lost": 0, "released": 0}
        self.why = ""  # why they stop; "" until they do
        self.ended = anyio.Event()  # every worker has ended
        self.wake = anyio.Event()  # ended, or a signal came
        self.error: BaseException | None = None

    async def host(self) -> None:
        """Run the workers until they end, shielded from the caller's scopes (only
        :meth:`stop` and :meth:`hurry` end them); keep a worker's fatal error (from
        claiming: the client closed, its session lost for good) for the caller."""
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for slot in self._slots:
                        tg.start_soon(self._work, slot)
        except BaseExceptionGroup as group:
            self.error = group.exceptions[0] if len(group.exceptions) == 1 else group
            self.why = self.why or f"{type(self.error).__name__}: {self.error}"
        finally:
            self.ended.set()
            self.wake.set()

    def stop(self, why: str) -> None:
        """Claim no more: the workers waiting for a job stop waiting. Not a checkpoint."""
        self.why = self.why or why
        for slot in self._slots:
            if slot.job is None and slot.scope is not None:
                slot.scope.cancel()

    def hurry(self) -> None:
        """Cancel every handler still running: their jobs are given back as they were."""
        self.stop("hurried")
        for slot in self._slots:
            if slot.scope is not None:
                slot.scope.cancel()

    def _claiming(self) -> bool:
        return not self.why

    async def _work(self, slot: _Slot) -> None:
        slot.declared = declare_asyncio()  # (the handler runs undeclared)
        try:
            while not self.why:
                await self._one(slot)
        finally:
            await slot.carry.give_back()  # claimed with the last ack: the workers stopped

    async def _escaped(self, job: Job | None) -> None:
        """A handler's cancellation of its own task got past its claim block: it took
        that cancellation, and was then cut short by the drain, whose scope does not
        take a cancellation it did not make (the claim's own scope, of its loss and the
        job's timeout, tells its own: ``Claiming.__aexit__``). That block gave its job
        back as it was. Withdrawn (shielded: the drain goes on), so that the worker ends
        as the drain wants."""
        with anyio.CancelScope(shield=True):
            await own_cancel.withdraw()
        self._count("released")
        _log.warning(
            "queue %r: job %s (attempt %d) released for another worker: its handler had "
            "taken a cancellation of its own task, which ended its claim block (%s)",
            self.name,
            job.id if job is not None else "-",
            job.attempt + 1 if job is not None else 0,
            self.why,
        )

    async def _one(self, slot: _Slot) -> None:
        """Claim one job and run the handler on it; count and log how it ended."""
        slot.job = slot.raised = None
        try:
            with anyio.CancelScope() as slot.scope:
                try:
                    async with self._claim(slot.carry) as job:
                        slot.job, slot.failures = job, 0
                        await self._run(slot, job)
                except ClaimLost as exc:
                    self._count("lost")
                    _log.warning("queue %r: job %s: %s", self.name, exc.job_id, exc)
                except Exception as exc:
                    if slot.job is None:  # from the claim, not from a handler
                        await self._claim_failed(slot, exc)
                        return
                    own = exc is slot.raised or isinstance(exc, JobTimeout)
                    self._failed(slot.job, exc, own)
                else:
                    self._count("released" if job._deferred else "acked")
            if slot.scope.cancelled_caught and slot.job is not None:
                self._count("released")
                _log.warning(
                    "queue %r: job %s (attempt %d) released for another worker: its "
                    "handler was still running when the grace ended (%s)",
                    self.name,
                    slot.job.id,
                    slot.job.attempt + 1,
                    self.why,
                )
        except asyncio.CancelledError:
            if own_cancel.by_scope():
                raise
            await self._escaped(slot.job)
        finally:
            slot.scope = slot.job = slot.raised = None

    async def _claim_failed(self, slot: _Slot, exc: Exception) -> None:
        """A claim failed. The client closed, or its session was lost with none to follow:
        the loop cannot go on, so the workers stop and the caller drains the others with
        their grace, then raises *exc*. Anything else (the store failing for a while) is
        logged, and this worker claims again after a backoff."""
        if isinstance(exc, ClosedError | SessionExpiredError):
            if self.error is None:
                self.error = exc
            self.stop(f"{type(exc).__name__}: {exc}")
            self.wake.set()  # the caller drains the handlers in flight, with their grace
            return
        _log.warning("queue %r: claiming failed, claiming again shortly: %s", self.name, exc)
        await _retry.backoff(slot.failures)
        slot.failures += 1

    async def _run(self, slot: _Slot, job: Job) -> None:
        try:
            with undeclared(slot.declared):
                # (Coord's cancellations, of the drain, a lost claim or the job's
                # timeout, are its scopes'; one of the handler's own is its failure.)
                await own_cancel.as_failure(partial(self._handler, job), partial(_cancelled, job))
        except Exception as exc:
            slot.raised = exc
            raise

    def _failed(self, job: Job, exc: Exception, own: bool) -> None:
        """Count and log an exception from the claim block, with what became of its
        job: the handler's own (the claim's ending went through), or one from the
        ending itself (then its outcome is not known)."""
        self._count("released" if job._deferred else "failed")
        _log.warning(
            "queue %r: job %s (attempt %d of %d) failed (%s: %s); %s",
            self.name,
            job.id,
            job.attempt + 1,
            self._retry.max_attempts,
            type(exc).__name__,
            exc,
            self._what_became_of(job) if own else "its ending failed: its outcome is unknown",
            exc_info=exc,
        )

    def _what_became_of(self, job: Job) -> str:
        retry = self._retry
        if job._deferred:
            return "deferred: released as it was, no attempt counted"
        if job.attempt + 1 < retry.max_attempts:
            delay = min(retry.delay * 2**job.attempt, retry.max_delay)
            return f"retried after {delay:g}s"
        return "parked" if retry.on_exhausted == "park" else "dead-lettered"

    def _count(self, what: str) -> None:
        self.counts[what] += 1


async def run_workers(
    name: str,
    claim: Callable[[Carry], AbstractAsyncContextManager[Job]],
    retry: RetryPolicy,
    handler: Callable[[Job], Awaitable[object]],
    *,
    concurrency: int,
    grace: float,
    signals: tuple[signal.Signals, ...],
) -> RunStats:
    """Run *concurrency* workers on the queue *name* until one of *signals* (then
    return their statistics) or a cancellation (then re-raise it), draining them either
    way; raise a worker's fatal error (from claiming) after the others are drained."""
    workers = _Workers(name, claim, retry, handler, concurrency)
    _log.info("queue %r: running %d workers (grace %gs)", name, concurrency, grace)
    with _receiver(signals) as received:
        async with anyio.create_task_group() as tg:
            tg.start_soon(workers.host)
            if received is not None:
                tg.start_soon(_follow, received, workers)
            try:
                await workers.wake.wait()
            except BaseException:
                await _drain(workers, grace, "cancelled")
                raise
            stats = await _drain(workers, grace, "its workers ended")
            tg.cancel_scope.cancel()  # the signal follower
    if workers.error is not None:
        raise workers.error
    return stats


async def _drain(workers: _Workers, grace: float, why: str) -> RunStats:
    """Stop claiming, wait up to *grace* for the handlers in flight, cancel the rest and
    wait for their jobs to be given back. Shielded: an anyio cancellation does not cut
    it short; another native one (or a second signal) cancels the handlers at once."""
    started = anyio.current_time()
    with anyio.CancelScope(shield=True):
        workers.stop(why)
        try:
            with anyio.move_on_after(grace):
                await workers.ended.wait()
            workers.hurry()
            await workers.ended.wait()
        except BaseException:
            workers.hurry()  # the task group's exit waits for them
            raise
        finally:
            stats = RunStats(**workers.counts, drained_in=anyio.current_time() - started)
            _log.info(
                "queue %r: stopped (%s), drained in %.2fs: %s",
                workers.name,
                workers.why,
                stats.drained_in,
                ", ".join(f"{n} {what}" for what, n in workers.counts.items()),
            )
    return stats


async def _follow(received: AsyncIterator[signal.Signals], workers: _Workers) -> None:
    """The first signal drains the workers; a second one cancels the handlers at once."""
    async for signum in received:
        if not workers.why:
            workers.stop(signum.name)
            workers.wake.set()
        else:
            workers.hurry()


def _cancelled(job: Job) -> RuntimeError:
    """What a handler's native cancellation becomes (:mod:`coord._core.own_cancel`): its
    failure, so that its attempt counts (the job retried, parked or dead-lettered as the
    queue is configured)."""
    return RuntimeError(
        f"the handler of job {job.id} was cancelled, and not by coord (asyncio: its task "
        "cancelled itself, or it awaited a task that was cancelled)"
    )


@contextlib.contextmanager
def _receiver(
    signals: tuple[signal.Signals, ...],
) -> Iterator[AsyncIterator[signal.Signals] | None]:
    """A receiver of *signals*, only in the main thread (only there can a handler be
    installed), and only if there are any."""
    if not signals or threading.current_thread() is not threading.main_thread():
        yield None
        return
    with anyio.open_signal_receiver(*signals) as received:
        yield received
