"""Putting a job: what the producer is told, and puts that can be repeated safely.

A put ends one of three ways, and says which:

* **done**: it returns a :class:`coord.JobRef`; the job is queued;
* **not done**: :exc:`TypeError` or :exc:`coord.ConfigurationError` at the call, before
  anything is written, or :exc:`coord.SessionExpiredError` raised before the request
  was sent;
* **unknown**: the request was sent and no answer came (the store stopped answering,
  or the session was lost while it was in flight): :exc:`coord.OutcomeUnknown`, with the
  job's id. The job may be queued, and may run. Nothing is deleted behind the caller's
  back: a clean-up racing the workers could not promise "not queued" (a worker may have
  taken the job first), and it would undo a repeated put that found the job queued.

A **cancelled** put did not queue its job: if the request reached the store anyway, the
client withdraws the job once the request has ended — in a task of the client, not of
the session, retrying across sessions until the store answers — unless a worker claimed
it first: then it runs, and a WARNING (logger ``coord``) names it.

**Repeatable puts.** ``put(..., job_id="order-42")`` queues the job at most once per id
while it is queued or in flight, and for ``dedupe_window`` seconds after the put (the
queue's option; SQS FIFO's deduplication interval is the model): a put that repeats the
id queues nothing and returns the job. It writes, in the same transaction as the job, a
marker ``N/_ids/@t<digest>`` (a digest of the id, so any string is an id) that records
the job and a nonce of the put that made it; markers older than the window are collected
by later repeatable puts. So the answer to :exc:`coord.OutcomeUnknown` is to put again
with the same ``job_id``.

**A repeat outranks a cancelled put's withdrawal**, whatever client or Queue object each
came from. A repeat that finds the marker within the window *marks* it (an update
guarded by the marker's version, adding ``"repeated"``; once per marker) before it
returns; a withdrawal removes the job and the marker in one transaction guarded by the
marker as read, and only if it is its put's own (the nonce) and not marked. So once a
repeat has been told the job is queued, every withdrawal of it is refused by the store;
a withdrawal that went first leaves no job for the repeat to find (its mark is refused,
and it reads again). The marker is marked, not the job: a job's version guards the
workers' claims and acks, which a write to the job would make fail; nothing but puts,
withdrawals and :meth:`coord.Queue.cancel` (which reads again when refused) guard on a
marker. A mark whose answer is lost makes the repeat's outcome unknown (the job may be
withdrawn, or not): :exc:`coord.OutcomeUnknown`, to put again. A repeat after the window
that finds the job still queued removes the expired marker and returns the job; a
withdrawal needs the marker, so a cancelled put's job whose marker expired before it
could be withdrawn (a withdrawal delayed past the window) stays queued, and a WARNING
names it.

**One client's puts of one id are ordered**, through every Queue object of that name
on the client (the lock of each id is the client's, as the looker is): each one reads
after the previous one's request has ended (answered, or its session gone), a cancelled
put's and one told unknown included; so a client never queues an id twice. Two
*different* clients putting the same id at the same moment on ZooKeeper may both queue
it: there a created name ends with a sequence number, so the marker cannot be unique
(each job then has its own marker; a withdrawal deletes only its own put's job). On
etcd and the memory store the second create is refused, and that put returns the first
put's job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import uuid
import weakref
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .._core import retry as _retry
from .._core.checks import check_int, check_seconds, check_str
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    ConfigurationError,
    OutcomeUnknown,
    SessionExpiredError,
)
from ..abc import Create, Remove, Update
from . import records as _records
from .combine import combiner_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from .._sessions.session import Session, SessionSource
    from ..abc import Backend, Entry

__all__ = ["Made", "Options", "Putter", "check_job_id", "check_options"]

_log = logging.getLogger("coord")

#: Expired markers a repeatable put collects, at most, each time.
_COLLECT = 8
#: Reads (and creates) a repeatable put tries, when what it read changed under it.
_TRIES = 4


def check_job_id(job_id: object) -> str:
    """Return a valid job id given by the caller, else raise."""
    check_str(job_id, "job_id")
    assert isinstance(job_id, str)
    if not job_id or len(job_id) > _records.MAX_JOB_ID_LENGTH or not job_id.isprintable():
        raise ConfigurationError(
            f"a job_id must be 1 to {_records.MAX_JOB_ID_LENGTH} printable characters, "
            f"got {job_id!r:.80}"
        )
    return job_id


@dataclass(frozen=True)
class Options:
    """A put's checked options, as the job's header stores them."""

    priority: int = 0
    not_before: float = 0.0
    timeout: float | None = None

    def state(self, job_id: str, key: str | None) -> _records.State:
        """The header of a new job with these options."""
        return _records.State(
            id=job_id,
            key=key,
            priority=self.priority,
            not_before=self.not_before,
            timeout=self.timeout,
        )


def check_options(priority: object, delay: object, not_before: object, timeout: object) -> Options:
    """A put's options checked at the call (TypeError for a wrong type,
    ConfigurationError for a bad value), with *delay* made a wall-clock time."""
    check_int(priority, "priority")
    assert isinstance(priority, int)
    if abs(priority) > _records.MAX_PRIORITY:
        raise ConfigurationError(
            f"priority must be an int from {-_records.MAX_PRIORITY:,} to "
            f"{_records.MAX_PRIORITY:,}, not {priority!r}"
        )
    at = 0.0
    if delay is not None and not_before is not None:
        raise ConfigurationError("give delay= or not_before=, not both")
    if delay is not None:
        seconds = check_seconds(delay, "delay")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigurationError(f"delay must be a number of seconds >= 0, not {delay!r}")
        at = time.time() + seconds if seconds else 0.0
    elif not_before is not None:
        at = check_seconds(not_before, "not_before")
        if not math.isfinite(at):
            raise ConfigurationError(
                f"not_before must be a finite time (as time.time() gives), not {not_before!r}"
            )
    if timeout is not None:
        seconds = check_seconds(timeout, "timeout")
        if not (math.isfinite(seconds) and seconds > 0):
            raise ConfigurationError(f"timeout must be a number of seconds > 0, not {timeout!r}")
        timeout = seconds
    return Options(priority, at, timeout)


@dataclass(frozen=True)
class Made:
    """A job that a put_many created, to withdraw if that call is cancelled: its entry
    id, its marker (a repeatable put's), its entry as made, and the nonce its marker
    records (a repeatable put's)."""

    waiter: str
    marker: str | None
    entry: Entry | None
    nonce: str | None = None


def _digest(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:32]


class _Order:
    """One client's puts of the job ids of one queue, in order: the per-id locks, and
    the request of each id still in flight (a cancelled put's, or one told unknown)."""

    def __init__(self) -> None:
        self.locks: dict[str, anyio.Lock] = {}
        self.in_flight: dict[str, anyio.Event] = {}


_ORDERS: weakref.WeakKeyDictionary[SessionSource, dict[str, _Order]] = weakref.WeakKeyDictionary()


def _order_for(source: SessionSource, name: str) -> _Order:
    """The order of *source*'s (a client's) puts to the queue *name*: one per client and
    queue, shared by every :class:`coord.Queue` object of that name on it."""
    orders = _ORDERS.setdefault(source, {})
    order = orders.get(name)
    if order is None:
        order = orders[name] = _Order()
    return order


class _Changed:
    """What a repeatable put read changed under it: read again."""


_CHANGED = _Changed()


class Putter:
    """The producer side of one queue: its puts, withdrawals and markers."""

    def __init__(self, source: SessionSource, name: str, dedupe_window: float) -> None:
        self._source = source
        self._name = name
        self._jobs = f"{name}/_jobs/"
        self._ids = f"{name}/_ids/"
        self._window = dedupe_window
        self._order = _order_for(source, name)

    async def put(
        self, data: bytes, key: str | None, job_id: str | None, options: Options
    ) -> _records.JobRef:
        """Queue a job (see the module docstring for what each ending means)."""
        if job_id is None:
            combiner = combiner_for(self._source, self._jobs, self._withdraw_new, self._unknown)
            return await combiner.put(data, key, partial(options.state, key=key))
        return await self._put_repeatable(data, key, check_job_id(job_id), options)

    async def _put_repeatable(
        self,
        data: bytes,
        key: str | None,
        job_id: str,
        options: Options,
        made: list[Made] | None = None,
    ) -> _records.JobRef:
        """A put with a job id. With *made* (put_many), a job it creates is added there
        (to be withdrawn if the put_many is cancelled later, unless the id is put again
        meanwhile: that put marks the marker, see the module docstring)."""
        digest = _digest(job_id)
        waiter = f"@j{digest}"
        async with self._exclusive(waiter):
            found, created, nonce = await self._find_or_create(data, key, job_id, digest, options)
            if made is not None and created is not None:
                made.append(Made(waiter, f"@t{digest}", created, nonce))
            return found

    async def _find_or_create(
        self, data: bytes, key: str | None, job_id: str, digest: str, options: Options
    ) -> tuple[_records.JobRef, Entry | None, str]:
        """The job of that id (and None), or the job created (and its entry); and the
        nonce of the marker it wrote."""
        waiter, marker = f"@j{digest}", f"@t{digest}"
        for _ in range(_TRIES):  # a marker collected, made or marked meanwhile: again
            session = await self._source.live()
            nonce = uuid.uuid4().hex
            try:
                found = await self._existing(session.backend, waiter, marker, job_id)
                if isinstance(found, _Changed):
                    continue
                if found is not None:
                    return found, None, nonce
                await self._collect(session)
                session.check()
            except (ClosedError, SessionExpiredError):
                continue  # the session was lost before anything was sent: on the next one
            record = {"id": job_id, "key": key, "at": time.time(), "put": nonce}
            ops = [
                Create(self._jobs, waiter, _records.encode(options.state(job_id, key), data)),
                Create(self._ids, marker, json.dumps(record).encode()),
            ]
            made = await self._create(session, ops, job_id, nonce)
            if made is not None and made[0] is not None:  # no checkpoint from here on
                return _records.JobRef(job_id, key, made[0].revision), made[0], nonce
        # Each try was refused, or not sent: this call queued nothing.
        raise BackendUnavailable(
            f"queue {self._name!r}: the put of job {job_id} did not go through in {_TRIES} "
            "tries (sessions lost, or markers changing under it); it queued nothing: put again"
        )

    async def _create(
        self, session: Session, ops: list[Create], job_id: str, nonce: str
    ) -> tuple[Entry | None, ...] | None:
        """The transaction that creates job and marker, in a task of the session: its
        result (None: refused, a marker or job of that id exists now), or raise. Until
        it ends, the client's next put of that id waits (see _exclusive)."""
        told: list[str] = []  # "unknown" once the caller is told so: then nothing is undone
        waiter, marker = ops[0].waiter_id, ops[1].waiter_id
        ended = self._in_flight(waiter)

        def undo(result: tuple[tuple[Entry | None, ...] | None] | None) -> None:
            made = result[0] if result is not None else None
            if told or (made is None and result is not None):  # told, or refused
                return
            # Cancelled, and made or unknown: withdraw it (unless put again since).
            self._withdraw_soon(waiter, marker, made[0] if made else None, nonce)

        async def create() -> tuple[tuple[Entry | None, ...] | None]:
            try:
                return (await session.backend.transact(ops),)
            finally:
                ended()

        try:
            # Not shielded: a cancelled put stops waiting at once (and undo withdraws
            # whatever its request made, once it ends). An ending: the client's close
            # waits for its answer (up to the TTL), so it is told done, not unknown.
            answer = await session.settle(create, undo=undo, shield=False, ending=True)
        except ClosedError:  # the session closed before the request was started
            ended()
            raise
        except (BackendUnavailable, SessionExpiredError) as exc:
            raise self._unknown(job_id, exc) from exc
        if answer is None:  # no answer within the TTL: it goes on without us
            told.append("unknown")
            raise self._unknown(job_id, None)
        return answer[0]

    def _in_flight(self, waiter: str) -> Callable[[], None]:
        """Record a request of *waiter*'s id in flight; the function that ends it."""
        event = self._order.in_flight[waiter] = anyio.Event()

        def ended() -> None:
            event.set()
            if self._order.in_flight.get(waiter) is event:
                del self._order.in_flight[waiter]

        return ended

    async def _existing(
        self, backend: Backend, waiter: str, marker: str, job_id: str
    ) -> _records.JobRef | _Changed | None:
        """The job a repeated put finds: its marker within the window (marked as
        repeated, so that no withdrawal deletes the job now), or the job itself (queued
        or in flight) when its marker expired. An expired marker is removed. _CHANGED:
        the marker changed under this read."""
        found = await backend.find(self._ids, marker, None)
        if found is not None:
            record = json.loads(found.value)
            if record["at"] + self._window > time.time():
                if not record.get("repeated") and not await self._mark(backend, found, job_id):
                    return _CHANGED
                return _records.JobRef(job_id, record["key"], found.revision)
            if await backend.transact([Remove(found)]) is None:
                return _CHANGED  # expired, and changed since it was read
        job = await backend.find(self._jobs, waiter, None)
        if job is None:
            return None
        # A job without a marker cannot be withdrawn (a withdrawal needs its marker as
        # made); unless a put made this job, and its marker, after the first read.
        if await backend.find(self._ids, marker, None) is not None:
            return _CHANGED
        state, _ = _records.decode(job)
        return _records.JobRef(job_id, state.key, job.revision)

    async def _mark(self, backend: Backend, found: Entry, job_id: str) -> bool:
        """Mark the marker *found* as repeated (guarded by its version): True once
        marked, False if it changed since it was read. The outcome unknown: the put's is
        too (the job of that id may or may not be withdrawn)."""
        record = {**json.loads(found.value), "repeated": True}
        try:
            return await backend.transact([Update(found, json.dumps(record).encode())]) is not None
        except BackendUnavailable as exc:
            raise self._unknown(job_id, exc) from exc

    async def _collect(self, session: Session) -> None:
        """Remove a few markers older than the window, oldest first (best effort)."""
        backend = session.backend
        try:
            oldest = await backend.entries(self._ids, limit=_COLLECT)
            for entry in oldest.entries:
                if json.loads(entry.value)["at"] + self._window > time.time():
                    return
                await backend.transact([Remove(entry)])
        except (BackendError, SessionExpiredError, ValueError, KeyError) as exc:
            _log.debug("queue %r: collecting job markers failed: %s", self._name, exc)

    def _unknown(self, job_id: str, exc: BaseException | None) -> OutcomeUnknown:
        why = f" ({exc})" if exc is not None else " in time"
        return OutcomeUnknown(
            f"queue {self._name!r}: the put of job {job_id} was sent and no answer came"
            f"{why}: it may have been queued. A put with a job_id can be repeated safely "
            "(a put repeating a job_id queues nothing more)",
            operation="put",
            job_id=job_id,
        )

    # -- withdrawing the job of a cancelled put --------------------------------------------

    @asynccontextmanager
    async def _exclusive(self, waiter: str) -> AsyncIterator[None]:
        """Hold the client's lock of *waiter*'s id, once its request in flight (if any)
        has ended: the client's puts and withdrawals of one id, one after another."""
        locks = self._order.locks
        lock = locks.setdefault(waiter, anyio.Lock())
        try:
            async with lock:
                flight = self._order.in_flight.get(waiter)
                if flight is not None:
                    await flight.wait()
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                locks.pop(waiter, None)

    def _withdraw_new(self, waiter: str, made: Entry | None) -> None:
        """Withdraw the job of a cancelled put of a fresh job (no marker)."""
        self._withdraw_soon(waiter, None, made)

    def _withdraw_soon(
        self, waiter: str, marker: str | None, made: Entry | None, nonce: str | None = None
    ) -> None:
        try:
            self._source.spawn(lambda: self._withdraw(waiter, marker, made, nonce), ending=True)
        except Exception as exc:  # the client is closing: nothing runs any more
            _log.warning(
                "queue %r: the job of a cancelled put (%s) may stay queued: %s",
                self._name,
                waiter,
                exc,
            )

    async def _withdraw(
        self, waiter: str, marker: str | None, made: Entry | None, nonce: str | None
    ) -> None:
        """Delete the job (and its marker) of a cancelled put, retrying across sessions
        while the client is open, unless a worker has claimed it or (a repeatable put)
        its id was put again since."""
        backend = self._source.backend
        try:
            for attempt in _retry.attempts():
                try:
                    async with self._exclusive(waiter):
                        if await self._withdrawn(backend, waiter, marker, made, nonce):
                            return
                except (BackendError, SessionExpiredError) as exc:
                    log = _log.warning if attempt == 3 else _log.debug
                    log("queue %r: withdrawing %s failed: %s", self._name, waiter, exc)
                await _retry.backoff(attempt)
        except Exception:  # a task of the client: were it to raise, the client would end
            _log.exception(
                "queue %r: withdrawing %s failed: it may stay queued", self._name, waiter
            )
        except BaseException:  # the client closed first (its close waited up to the TTL)
            _log.warning(
                "queue %r: the client closed before the job of a cancelled put (%s) "
                "was withdrawn: it may stay queued",
                self._name,
                waiter,
            )
            raise

    async def _withdrawn(
        self,
        backend: Backend,
        waiter: str,
        marker: str | None,
        made: Entry | None,
        nonce: str | None,
    ) -> bool:
        """One try: True once there is nothing more to do (False: the job or its marker
        changed between the reads and the delete; look again)."""
        job = await backend.find(self._jobs, waiter, None)
        if job is None or (made is not None and job.revision != made.revision):
            return True  # never queued, or gone (a job of that id now is another put's)
        ops = [Remove(job)]
        if marker is not None:
            found = await backend.find(self._ids, marker, None)
            if not self._withdrawable(found, nonce, job):
                return True
            assert found is not None
            ops.append(Remove(found))  # guarded: refused if a repeat marks it meanwhile
        state, _ = _records.decode(job)
        # Unclaimed: as it was made (when that is known), or never claimed by anyone.
        fresh = job.version == made.version if made is not None else state.claim is None
        if not fresh or state.attempt:
            _log.warning(
                "queue %r: job %s of a cancelled put was claimed by a worker before "
                "it could be withdrawn: it runs",
                self._name,
                state.id,
            )
            return True
        return await backend.transact(ops) is not None

    def _withdrawable(self, found: Entry | None, nonce: str | None, job: Entry) -> bool:
        """Whether a repeatable put's job may be withdrawn, by its marker as read: the
        put's own, and not marked by a repeat."""
        if found is None:
            _log.warning(
                "queue %r: job %s of a cancelled put stays queued: its dedupe marker "
                "expired before the job could be withdrawn (a put of its id since may "
                "have been told it is queued)",
                self._name,
                _records.decode(job)[0].id,
            )
            return False
        record = json.loads(found.value)
        if record.get("put") != nonce:
            return False  # another put's job and marker: ours are gone
        if record.get("repeated"):
            _log.debug(
                "queue %r: job %s of a cancelled put stays queued: put again since",
                self._name,
                record.get("id"),
            )
            return False
        return True
