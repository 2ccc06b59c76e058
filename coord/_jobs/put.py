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
the job; markers older than the window are collected by later repeatable puts. So the
answer to :exc:`coord.OutcomeUnknown` is to put again with the same ``job_id``. (Two
*different* clients putting the same id at the same moment on ZooKeeper may both queue
it: there a created name ends with a sequence number, so the marker cannot be unique.
A repeated put from one client is ordered after its first on the session.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import uuid
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
    EntryGoneError,
    OutcomeUnknown,
    SessionExpiredError,
)
from ..abc import Create, Remove
from . import records as _records

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._sessions.session import Session, SessionSource
    from ..abc import Backend, Entry

__all__ = ["Made", "Options", "Putter", "check_job_id", "check_options"]

_log = logging.getLogger("coord")

#: Expired markers a repeatable put collects, at most, each time.
_COLLECT = 8


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
    id, its marker (a repeatable put's), its entry as made, and its put's token."""

    waiter: str
    marker: str | None
    entry: Entry | None
    token: object = None


def _digest(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()[:32]


class Putter:
    """The producer side of one queue: its puts, withdrawals and markers."""

    def __init__(self, source: SessionSource, name: str, dedupe_window: float) -> None:
        self._source = source
        self._name = name
        self._jobs = f"{name}/_jobs/"
        self._ids = f"{name}/_ids/"
        self._window = dedupe_window
        # The latest put of each job id whose cancellation may still be undone: the
        # withdrawal of a cancelled put goes on only while no later put of its id came
        # (that one returned the job, which must stay), and a put and a withdrawal of
        # one id never interleave (the lock).
        self._latest: dict[str, object] = {}
        self._locks: dict[str, anyio.Lock] = {}

    async def put(
        self, data: bytes, key: str | None, job_id: str | None, options: Options
    ) -> _records.JobRef:
        """Queue a job (see the module docstring for what each ending means)."""
        if job_id is None:
            return await self._put_once(data, key, uuid.uuid4().hex, options)
        return await self._put_repeatable(data, key, check_job_id(job_id), options)

    async def _put_once(
        self, data: bytes, key: str | None, job_id: str, options: Options
    ) -> _records.JobRef:
        waiter = f"@j{job_id}"
        session = await self._source.live()
        session.check()  # a session lost before anything is sent: not done
        try:
            position = await session.register(
                self._jobs,
                value=_records.encode(options.state(job_id, key), data),
                ahead=0,
                waiter_id=lambda: waiter,
                durable=True,
                retry=False,
                on_abandon=partial(self._withdraw_soon, waiter, None),
            )
        except (BackendUnavailable, SessionExpiredError, EntryGoneError) as exc:
            raise self._unknown(job_id, exc) from exc
        return _records.JobRef(job_id, key, position.entry.revision)

    async def _put_repeatable(
        self,
        data: bytes,
        key: str | None,
        job_id: str,
        options: Options,
        made: list[Made] | None = None,
    ) -> _records.JobRef:
        """A put with a job id. With *made* (put_many), a job it creates is added there,
        and its id stays the latest put of that id (so that a withdrawal of it, if the
        put_many is cancelled later, goes on unless the id is put again meanwhile)."""
        digest = _digest(job_id)
        waiter, token = f"@j{digest}", object()
        async with self._exclusive(waiter):
            self._latest[waiter] = token  # an earlier put's withdrawal stops here
            cancelled = anyio.get_cancelled_exc_class()
            try:
                found, created = await self._find_or_create(
                    data, key, job_id, digest, token, options
                )
            except cancelled:
                raise  # its transaction may end later: its undo decides then
            except BaseException:
                self._forget(waiter, token)
                raise
            if made is not None and created is not None:
                made.append(Made(waiter, f"@t{digest}", created, token))
            else:
                self._forget(waiter, token)
            return found

    async def _find_or_create(
        self,
        data: bytes,
        key: str | None,
        job_id: str,
        digest: str,
        token: object,
        options: Options,
    ) -> tuple[_records.JobRef, Entry | None]:
        """The job of that id (and None), or the job created (and its entry)."""
        waiter, marker = f"@j{digest}", f"@t{digest}"
        for _ in range(3):  # a marker collected or made by someone else meanwhile: again
            session = await self._source.live()
            try:
                found = await self._existing(session.backend, waiter, marker, job_id)
                if found is not None:
                    return found, None
                await self._collect(session)
                session.check()
            except (ClosedError, SessionExpiredError):
                continue  # the session was lost before anything was sent: on the next one
            record = json.dumps({"id": job_id, "key": key, "at": time.time()}).encode()
            ops = [
                Create(self._jobs, waiter, _records.encode(options.state(job_id, key), data)),
                Create(self._ids, marker, record),
            ]
            made = await self._create(session, ops, job_id, token)
            if made is not None and made[0] is not None:  # no checkpoint from here on
                return _records.JobRef(job_id, key, made[0].revision), made[0]
        # Each try was refused, or not sent: this call queued nothing.
        raise BackendUnavailable(
            f"queue {self._name!r}: the put of job {job_id} did not go through in 3 tries "
            "(sessions lost, or markers changing under it); it queued nothing: put again"
        )

    async def _create(
        self, session: Session, ops: list[Create], job_id: str, token: object
    ) -> tuple[Entry | None, ...] | None:
        """The transaction that creates job and marker, in a task of the session: its
        result (None: refused, a marker or job of that id exists now), or raise."""
        told: list[str] = []  # "unknown" once the caller is told so: then nothing is undone
        waiter, marker = ops[0].waiter_id, ops[1].waiter_id

        def undo(result: tuple[tuple[Entry | None, ...] | None] | None) -> None:
            made = result[0] if result is not None else None
            if told or (made is None and result is not None):  # told, or refused
                self._forget(waiter, token)
            else:  # cancelled, and made or unknown: withdraw it (unless put again)
                self._withdraw_soon(waiter, marker, made[0] if made else None, token)

        async def create() -> tuple[tuple[Entry | None, ...] | None]:
            return (await session.backend.transact(ops),)

        try:
            # Not shielded: a cancelled put stops waiting at once (and undo withdraws
            # whatever its request made, once it ends).
            answer = await session.settle(create, undo=undo, shield=False)
        except (BackendUnavailable, SessionExpiredError) as exc:
            raise self._unknown(job_id, exc) from exc
        if answer is None:  # no answer within the TTL: it goes on without us
            told.append("unknown")
            raise self._unknown(job_id, None)
        return answer[0]

    def _forget(self, waiter: str, token: object) -> None:
        if token is not None and self._latest.get(waiter) is token:
            del self._latest[waiter]

    async def _existing(
        self, backend: Backend, waiter: str, marker: str, job_id: str
    ) -> _records.JobRef | None:
        """The job a repeated put finds: its marker within the window, or the job itself
        (queued or in flight; its marker may be gone). An expired marker is removed."""
        found = await backend.find(self._ids, marker, None)
        if found is not None:
            record = json.loads(found.value)
            if record["at"] + self._window > time.time():
                return _records.JobRef(job_id, record["key"], found.revision)
            await backend.transact([Remove(found)])  # expired: refused if changed meanwhile
        job = await backend.find(self._jobs, waiter, None)
        if job is not None:
            state, _ = _records.decode(job)
            return _records.JobRef(job_id, state.key, job.revision)
        return None

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
        lock = self._locks.setdefault(waiter, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(waiter, None)

    def _withdraw_soon(
        self, waiter: str, marker: str | None, made: Entry | None, token: object = None
    ) -> None:
        try:
            self._source.spawn(lambda: self._withdraw(waiter, marker, made, token))
        except Exception as exc:  # the client is closing: nothing runs any more
            _log.warning(
                "queue %r: the job of a cancelled put (%s) may stay queued: %s",
                self._name,
                waiter,
                exc,
            )

    async def _withdraw(
        self, waiter: str, marker: str | None, made: Entry | None, token: object
    ) -> None:
        """Delete the job (and its marker) of a cancelled put, retrying across sessions
        while the client is open, unless a worker has claimed it or (a repeatable put)
        its id was put again since."""
        backend = self._source.backend
        try:
            for attempt in _retry.attempts():
                try:
                    async with self._exclusive(waiter):
                        if token is not None and self._latest.get(waiter) is not token:
                            return  # put again since: that put returned the job
                        if await self._withdrawn(backend, waiter, marker, made):
                            return
                except (BackendError, SessionExpiredError) as exc:
                    log = _log.warning if attempt == 3 else _log.debug
                    log("queue %r: withdrawing %s failed: %s", self._name, waiter, exc)
                await _retry.backoff(attempt)
        except Exception:  # a task of the client: were it to raise, the client would end
            _log.exception(
                "queue %r: withdrawing %s failed: it may stay queued", self._name, waiter
            )
        finally:
            self._forget(waiter, token)

    async def _withdrawn(
        self, backend: Backend, waiter: str, marker: str | None, made: Entry | None
    ) -> bool:
        """One try: True once there is nothing more to do (False: the job changed
        between the read and the delete; look again)."""
        job = await backend.find(self._jobs, waiter, None)
        if job is None:
            return True  # never queued (or already gone)
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
        ops = [Remove(job)]
        found = await backend.find(self._ids, marker, None) if marker is not None else None
        if found is not None:
            ops.append(Remove(found))
        return await backend.transact(ops) is not None
