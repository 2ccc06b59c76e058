"""Looker: one client's claims on one queue, made for all of its idle workers.

A worker that wants a job (``async with queue.claim()``) asks its client's looker for
the queue and waits, in a local line, for the job it is handed. The looker is one task
of the client, running while some of its workers wait:

* **Busy queue.** It claims jobs for the workers waiting, each with its own
  transaction, all at once (:func:`coord._jobs.claim.claim`: the job's header guarded
  by its version as read, the claim entry on the worker's lease); each claimed job goes
  to the worker that has waited longest. It takes them from a *stock*: the claimable
  jobs of its last read of the head of the queue (up to 8), so most claims need no read
  of their own. A stock can be stale — that is safe, since a job claimed, acked or
  changed meanwhile fails its guard, and the looker reads again when most of a round's
  claims fail. Reads of the jobs may be served from the store member's applied state
  (etcd's serializable read), for the same reason. The live claims (which tell a dead
  worker's job, to be claimed again) are read after the jobs, when nothing is claimable
  without them, and at least every half second.
* **Lanes.** Lookers of other clients claim from the same head. Alone, a looker takes
  the oldest claimable jobs. After a conflict (a job another looker had first) it takes,
  for two seconds, only the jobs of its own lane: its place among the lookers whose
  claims it has seen lately (each claim names its looker), a job's lane being a hash of
  its key. So lookers in contention reach for different jobs, and nobody waits for
  anybody: claims scale with the workers, up to the store's rate of transactions.
* **Idle queue.** With nothing claimable, the looker takes a place among the queue's
  idle lookers (``<name>/_idle``, a semaphore of 2 in registration order) and, once it
  is one of the first two, watches the queue: a put (or an ack that frees a key, the
  end of a backoff, an unpark) wakes those two lookers only, never every idle worker of
  every client. Two, so that one whose process died (its entry goes only with its
  session) costs nothing: the other claims the job at once. A looker that claims leaves
  the line, and comes back at its end if its workers wait again: the clients take turns.

A worker that comes back for a job while nobody of its client waits before it, and the
stock holds one, claims it in its own task (:meth:`Looker._claim_own`), beside the
looker's claims: it does not wait for a round to end, and no task hands it over.

A job claimed for a worker that stopped waiting meanwhile (cancelled) goes to the next
waiting worker, or is given back (no attempt counted).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import random
import time
import uuid
import weakref
import zlib
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    LockLost,
    SessionExpiredError,
)
from .._locks.semaphore import Semaphore
from . import claim as _claiming
from . import records as _records
from .endings import lost_attempt, release_soon
from .records import Job

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._locks.hold import Hold
    from .._sessions.session import Session, SessionSource
    from ..abc import Backend, Entry, Listing
    from .endings import RetryPolicy

__all__ = ["IDLE_WATCHERS", "Looker", "looker_for"]

_log = logging.getLogger("coord")

#: Idle lookers that watch the queue at once: a put wakes these, and one of them may die.
IDLE_WATCHERS = 2
# A look reads this many of the oldest jobs first (then 8x more, ..., then all), so that
# a long queue whose head is claimable sends one short reply, not every job.
_FIRST_LOOK = 128
# A read keeps up to this many claimable jobs in stock (and up to _STOCK_BYTES of their
# payloads, beyond the jobs the waiting workers need now), claimed by the next rounds
# without reading again (each claim is guarded by the job's version as read). Reads are
# what a busy queue costs the store most: etcd sorts by creation only after reading
# every key of the range, so each read of the head costs it the whole queue (0.5 reads
# a job took 2.5 ms of etcd's CPU a job with 3,000 jobs queued; a claim, 0.25 ms).
_STOCK = 64
_STOCK_BYTES = 1 << 20
# ... and reads again after this many seconds whatever is left of it, so that no stock
# outlives a queue emptied and refilled (a name made again may match an old version:
# see coord.abc.Update).
_STOCK_FOR = 0.5
# After a conflict, lookers take jobs of their own lane for this many seconds.
_CONTENDED_FOR = 2.0
# A looker whose claims were seen within this many seconds counts (see Looker._share).
_LOOKERS_FOR = 3.0
# The live claims are read at least this often (seconds) while jobs are claimable.
_CLAIMS_EVERY = 0.5

_LOOKERS: weakref.WeakKeyDictionary[SessionSource, dict[str, Looker]] = weakref.WeakKeyDictionary()


def looker_for(source: SessionSource, name: str) -> Looker:
    """The looker of *source* (a client's sessions) for the queue *name*: one per client
    and queue, shared by every :class:`coord.Queue` object of that name on it."""
    lookers = _LOOKERS.setdefault(source, {})
    looker = lookers.get(name)
    if looker is None:
        looker = lookers[name] = Looker(source, name)
    return looker


class _Waiter:
    """A worker waiting for a job: handed one (or an error) by the looker."""

    __slots__ = ("error", "gone", "job", "ready", "retry")

    def __init__(self, retry: RetryPolicy) -> None:
        self.retry = retry
        self.ready = anyio.Event()
        self.job: Job | None = None
        self.error: BaseException | None = None
        self.gone = False  # it stopped waiting (cancelled)


class Looker:
    """Claims jobs of the queue *name* for the waiting workers of one client.

    :param source: the client's sessions
    :param name: the queue's name
    """

    def __init__(self, source: SessionSource, name: str) -> None:
        self._source = source
        self._name = name
        self._jobs = f"{name}/_jobs/"
        self._claims = f"{name}/_claims/"
        self._idle = Semaphore(source, _keys.internal_name(name, "_idle"), IDLE_WATCHERS)
        self._idle._counted = False  # the lookers' turns are not the user's locks
        self._slot: Hold | None = None
        self._waiters: deque[_Waiter] = deque()
        self._running = False
        self._watching: anyio.CancelScope | None = None
        self._token = uuid.uuid4().hex[:12]  # names this looker's claims (see _share)
        self._lookers: list[str] = [self._token]  # the lookers seen claiming lately
        self._seen: dict[str, float] = {}  # looker token -> when last seen (monotonic)
        self._contended_until = 0.0  # lanes until then (monotonic; see _share)
        self._conflicts = 0  # claims of this round that another client had first
        self._claims_due = 0.0  # when the claims must be read again (monotonic)
        self._stock: list[_claiming.Pick] = []  # claimable when last read, oldest first
        self._stock_session: Session | None = None
        self._stock_until = 0.0  # the stock is read again after then (monotonic)
        # Workers claim from the stock in their own tasks when nobody waits before them
        # (see _claim_own): the store keys they are claiming, those claimed while the
        # looker read (which the read may show unclaimed), and since the last read, how
        # many they claimed and how many of those another looker had first.
        self._reading = False
        self._claiming: dict[str, None] = {}
        self._claimed_meanwhile: set[str] = set()
        self._own_claims = self._own_conflicts = 0
        self._claims_ended: anyio.Event | None = None
        # Per job of the last read that has a key: the next job of that key read (see
        # _acked), by the store key of the job before it.
        self._after: dict[str, tuple[Entry, int]] = {}
        # See _decode: (creation revision, version) -> header and payload, per key.
        self._decoded: dict[str, tuple[tuple[int, int], _records.State, bytes]] = {}
        #: Read every outstanding job at each look, to claim the highest priorities
        #: first: set by a Queue opened with ``priorities=True``, or on reading a job
        #: with a priority; for the looker's life.
        self.priorities = False

    def __repr__(self) -> str:
        return f"<coord.Looker {self._name!r} waiting={len(self._waiters)}>"

    async def next(self, retry: RetryPolicy) -> Job:
        """The next job for this worker, claimed (nothing is claimed if this is
        cancelled). A checkpoint; waits for a claimable job.

        :raises ClosedError: if the client is closed
        :raises SessionExpiredError: if the session is lost and none will follow
        """
        self._source.check_open()
        while not self._waiters:  # nobody waits before this worker: claim from the stock
            stocked = self._pick()
            if stocked is None:
                break
            job = await self._claim_own(*stocked, retry)
            if job is not None:
                return job
        waiter = _Waiter(retry)
        self._waiters.append(waiter)
        self._start()
        try:
            await waiter.ready.wait()
        except BaseException:
            waiter.gone = True
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            if waiter.job is not None:  # handed over as this one stopped waiting
                self._pass_on(waiter.job, waiter.retry)
            self._stop_watching_if_idle()
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.job is not None
        return waiter.job

    # -- the looker's task ------------------------------------------------------------------

    def _start(self) -> None:
        if self._running:
            return
        self._running = True
        try:
            self._source.spawn(self._run)
        except (ClosedError, SessionExpiredError) as exc:  # (a session used alone, lost)
            self._running = False
            self._fail_all(exc)

    def _stop_watching_if_idle(self) -> None:
        if not self._waiters and self._watching is not None:
            self._watching.cancel()  # nobody waits: the looker may end

    async def _run(self) -> None:
        try:
            while self._waiters:
                session = await self._source.live()
                try:
                    await self._round(session)
                except SessionExpiredError:
                    # The store refused the session (its lease expired there before the
                    # client knew): the next one, if any (live() raises if none).
                    if not self._source.renews:
                        raise
                    session.declare_lost("the store refused a request on the session's lease")
        except (ClosedError, SessionExpiredError) as exc:
            self._fail_all(exc)
        except Exception as exc:  # never into the client's task group: to the workers
            _log.exception("queue %r: the looker failed", self._name)
            self._fail_all(exc)
        finally:
            self._running = False
            if not self._waiters:
                # Nobody waits: hold no header cache (up to 4,096 jobs), but keep the
                # stock (bounded, read again after _STOCK_FOR): a worker that is back
                # from its job a moment later claims without a read.
                self._decoded = {}
            await self._leave_idle()
            if self._waiters:  # came while it ended
                self._start()

    def _fail_all(self, error: BaseException) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.error = error
            waiter.ready.set()

    async def _round(self, session: Session) -> None:
        """Claim from the stock of claimable jobs last read; with none left, read the head
        of the queue, and if nothing is claimable there, wait for a change."""
        backend = session.backend
        if (
            not self._stock
            or self._stock_session is not session
            or time.monotonic() >= self._stock_until
        ):
            self._reading, self._claimed_meanwhile = True, set()
            try:
                jobs, claims = await self._read(session)
            finally:
                self._reading = False
            self._own_claims = self._own_conflicts = 0
            live = None if claims is None else {_records.id_of(e.key) for e in claims.entries}
            now = time.time()
            picks, wake_at = _claiming.choose_many(
                jobs.entries, live, now, len(jobs.entries), self._decode, priorities=self.priorities
            )
            # Not the jobs workers claim in their own tasks (or claimed during the read,
            # which may predate their claims): claimed twice, they would look contended.
            # Left out once chosen, not before: such a job still holds back its key's
            # next one.
            busy = self._claimed_meanwhile.union(self._claiming)
            if busy:
                picks = [p for p in picks if p.entry is not None and p.entry.key not in busy]
            if not picks and busy:
                # What is claimable, workers are claiming in their own tasks: the claims
                # that fail make their jobs claimable again with no change to watch for.
                await self._own_claims_ended()
                return
            if not picks:
                assert claims is not None  # nothing claimable: the claims were read (_read)
                await self._wait_idle(backend, jobs, claims, wake_at)
                return
            self._stock, self._stock_session = self._stocked(self._share(picks)), session
            self._after = (
                {}
                if self.priorities
                else _successors(
                    jobs.entries,
                    self._decode,
                    busy.union(p.entry.key for p in self._stock if p.entry),
                )
            )
            # ... and no longer than until a job read comes due (delayed, or backing off):
            # it may be older than the stock, and is claimed before it (put order).
            due = _STOCK_FOR if wake_at is None else min(_STOCK_FOR, max(wake_at - now, 0.0))
            self._stock_until = time.monotonic() + due
        self._conflicts = 0
        picks = self._take(len(self._waiters))
        if self.priorities:
            self._stock = []  # a job of higher priority may come: each round reads
        await self._claim_all(session, picks)
        if self._conflicts:
            self._conflicted(self._conflicts, len(picks))
        if self._conflicts < len(picks) or not self._waiters:
            # It claimed: to the back of the idle line, if it must wait again, so that
            # the idle lookers of other clients have their turn (one key's jobs, one at
            # a time, go round the clients instead of to the first two).
            await self._leave_idle()

    def _share(self, picks: list[_claiming.Pick]) -> list[_claiming.Pick]:
        """This looker's share of the claimable jobs *picks* (oldest first). Without a
        conflict in the last :data:`_CONTENDED_FOR` seconds, all of them. Else those of its
        lane, its place among the n lookers whose claims it last read (a job's lane is a
        hash of its key, modulo n), so that lookers
        claiming at once reach for different jobs. Alone, that is every job, oldest
        first. All of them if its share is empty (fewer jobs than lookers)."""
        lookers = self._lookers
        if time.monotonic() >= self._contended_until or self.priorities:
            return picks  # no conflict lately (or priorities first): the oldest first
        lane, lanes = lookers.index(self._token), len(lookers)
        mine = [p for p in picks if _lane(p, lanes) == lane]
        if mine:
            return mine
        return sorted(random.sample(picks, min(len(picks), _STOCK)), key=_claiming.rank)

    def _stocked(self, picks: list[_claiming.Pick]) -> list[_claiming.Pick]:
        """The first of *picks* to keep in stock: as many as the workers waiting now,
        then more up to :data:`_STOCK` jobs and :data:`_STOCK_BYTES` of payloads."""
        kept, size = len(self._waiters), 0
        for pick in picks[kept:_STOCK]:
            size += len(pick.payload)
            if size > _STOCK_BYTES:
                break
            kept += 1
        return picks[:kept]

    def _given_back(self) -> None:
        """A job this looker claimed is given back as it was: it is older than every job
        of the stock (read while it was claimed), so a lone worker must claim it first
        (FIFO): the next round reads the head again. Not a checkpoint."""
        self._stock = []

    def _acked(self, session: Session, key: str) -> None:
        """The job stored at *key*, claimed by this looker, was acked: the next job of
        its ordering key, if the last read saw it, is claimable now (unless it is
        parked, claimed, backing off or in another looker's lane). Into the stock, in
        its place by age, so that a key's jobs go on without a read of the head of the
        queue each (on etcd that costs the store the whole queue). Not a checkpoint."""
        after = self._after.pop(key, None)
        if (
            after is None
            or session is not self._stock_session
            or time.monotonic() >= self._stock_until
            or self.priorities
        ):
            return
        picks, _ = _claiming.choose_many([after[0]], None, time.time(), 1, self._decode)
        if picks and self._share(picks) == picks:
            picks[0].order = after[1]  # its place in the read: among the stock by age
            bisect.insort(self._stock, picks[0], key=_claiming.rank)

    def _seen_lookers(self, claims: Listing) -> None:
        """Note the lookers that hold claims now (their token is in the claim's value);
        those seen within :data:`_LOOKERS_FOR` seconds count."""
        now = time.monotonic()
        seen = self._seen
        seen[self._token] = now
        for entry in claims.entries:
            with contextlib.suppress(ValueError, AttributeError):
                token = json.loads(entry.value).get("looker")
                if isinstance(token, str):
                    seen[token] = now
        for token in [t for t, at in seen.items() if at < now - _LOOKERS_FOR]:
            del seen[token]
        self._lookers = sorted(seen)

    def _pick(self) -> tuple[Session, _claiming.Pick] | None:
        """The oldest job of a fresh stock and the session it was read on, for a worker to
        claim in its own task; None while the looker reads (or with no fresh stock)."""
        session = self._stock_session
        if (
            not self._stock
            or self._reading
            or session is None
            or session.lost
            or not session.running
            or time.monotonic() >= self._stock_until
        ):
            return None
        return session, self._stock.pop(0)

    async def _claim_own(
        self, session: Session, pick: _claiming.Pick, retry: RetryPolicy
    ) -> Job | None:
        """Claim *pick* in the worker's own task, as the looker's round would for it
        (:meth:`_claim_for`), while the looker's claims for other workers are in flight:
        no hand-over between tasks, and a worker back from its job does not wait for a
        round to end. None if someone else had it (the worker tries the next one)."""
        assert pick.entry is not None
        key = pick.entry.key
        self._claiming[key] = None
        try:
            job = await self._claim(session, pick, retry)
        except SessionExpiredError:
            session.declare_lost("the store refused a request on the session's lease")
            job = None
        finally:
            del self._claiming[key]
            if self._reading:
                self._claimed_meanwhile.add(key)
            if not self._claiming and self._claims_ended is not None:
                self._claims_ended.set()
                self._claims_ended = None
        self._own_claims += 1
        if job is None:
            self._own_conflicts += 1
            self._conflicted(self._own_conflicts, self._own_claims)
        return job

    async def _own_claims_ended(self) -> None:
        """Wait until no worker claims in its own task (at once if none does)."""
        if self._claiming:
            if self._claims_ended is None:
                self._claims_ended = anyio.Event()
            await self._claims_ended.wait()

    def _conflicted(self, conflicts: int, claims: int) -> None:
        """Another looker had some of *claims* (*conflicts* of them): learn who claims
        (its lane may be new), and read again if the stock was mostly taken meanwhile."""
        self._claims_due = 0.0
        self._contended_until = time.monotonic() + _CONTENDED_FOR
        if conflicts * 2 > claims:
            self._stock = []

    def _take(self, wanted: int) -> list[_claiming.Pick]:
        """Take the oldest *wanted* picks out of the stock."""
        taken, self._stock = self._stock[:wanted], self._stock[wanted:]
        return taken

    async def _wait_idle(
        self, backend: Backend, jobs: Listing, claims: Listing, wake_at: float | None
    ) -> None:
        """Nothing is claimable: take a place among the idle lookers, or, holding one,
        watch the queue until something may have changed."""
        if not self._holding_slot():
            await self._enter_idle()
            return  # read again: the watch starts from a read made as a watcher
        with anyio.CancelScope() as self._watching:
            if self._waiters:
                await _claiming.wait_for_change(
                    backend, (self._jobs, jobs), (self._claims, claims), wake_at
                )
        self._watching = None

    async def _read(self, session: Session) -> tuple[Listing, Listing | None]:
        """The oldest jobs (more if none of them is claimable), and the live claims when
        they are needed: when no job is claimable unless some claim it names is dead, and
        at least every :data:`_CLAIMS_EVERY` seconds (so that the job of a dead worker is
        found while others are claimable). Without them every claim a job names is taken
        to be live, which is safe: its job is only passed over for now."""
        backend = session.backend
        limit: int | None = None if self.priorities else _FIRST_LOOK
        for attempt in _retry.attempts():
            try:
                jobs = await backend.entries(self._jobs, limit=limit, stale_ok=True)
                read = {e.key for e in jobs.entries}
                self._decoded = {k: v for k, v in self._decoded.items() if k in read}
                claims = None
                now = time.monotonic()
                if now >= self._claims_due or not self._any_claimable(jobs, None):
                    # Read after the jobs: a claim made after the jobs were read fails
                    # its guard; one deleted after this read is seen by a watch from it.
                    claims = await backend.entries(self._claims)
                    self._claims_due = now + _CLAIMS_EVERY
                    self._seen_lookers(claims)
            except BackendUnavailable:
                await _retry.backoff(attempt)
                continue
            if limit is not None and any(_records.has_priority(e) for e in jobs.entries):
                self.priorities, limit = True, None  # a job with a priority: read all
                continue
            if claims is not None and limit is not None and len(jobs.entries) >= limit:
                if not self._any_claimable(jobs, claims):  # none among the oldest: further
                    limit = limit * 8 if limit < _FIRST_LOOK * 64 else None
                    continue
            return jobs, claims
        raise AssertionError("unreachable")  # pragma: no cover

    def _any_claimable(self, jobs: Listing, claims: Listing | None) -> bool:
        live = None if claims is None else {_records.id_of(e.key) for e in claims.entries}
        return bool(_claiming.choose_many(jobs.entries, live, time.time(), 1, self._decode)[0])

    def _decode(self, entry: Entry) -> tuple[_records.State, bytes]:
        """:func:`coord._jobs.records.decode`, remembered per key, creation and version
        (a name made again may start again at an old version: see
        :class:`coord.abc.Update`): the head of a busy queue is read again and again,
        mostly unchanged. Only the jobs of the latest read are kept (see :meth:`_read`)."""
        known = self._decoded.get(entry.key)
        if known is not None and known[0] == (entry.revision, entry.version):
            return known[1], known[2]
        state, payload = _records.decode(entry)
        self._decoded[entry.key] = ((entry.revision, entry.version), state, payload)
        return state, payload

    async def _claim_all(self, session: Session, picks: list[_claiming.Pick]) -> None:
        """Claim each of *picks* at once, each for the worker that has waited longest."""
        if len(picks) == 1 and self._waiters:  # one claim: no task group for it
            await self._claim_for(session, picks[0], self._waiters.popleft())
            return
        async with anyio.create_task_group() as tg:
            for pick in picks:
                if not self._waiters:
                    break
                waiter = self._waiters.popleft()
                tg.start_soon(self._claim_for, session, pick, waiter)

    async def _claim_for(self, session: Session, pick: _claiming.Pick, waiter: _Waiter) -> None:
        try:
            job = await self._claim(session, pick, waiter.retry)
        except SessionExpiredError:  # the session is over: the next one, if any
            session.declare_lost("the store refused a request on the session's lease")
            job = None
        except Exception as exc:  # told to the worker, as its own call's failure
            if not waiter.gone:
                waiter.error = exc
                waiter.ready.set()
            return
        except BaseException:  # the looker is cancelled (the client closes)
            if not waiter.gone:
                self._waiters.appendleft(waiter)
            raise
        if job is None:  # someone else had it: the worker waits on, first in line
            self._conflicts += 1
            if not waiter.gone:
                self._waiters.appendleft(waiter)
            return
        if waiter.gone:
            self._pass_on(job, waiter.retry)
            return
        waiter.job = job
        waiter.ready.set()

    async def _claim(
        self, session: Session, pick: _claiming.Pick, retry: RetryPolicy
    ) -> Job | None:
        """Claim *pick* (counting a lost attempt first); None if it could not be had."""
        assert pick.entry is not None
        assert pick.state is not None
        backend = session.backend
        if pick.state.claim is not None:  # its last claim ended without ack or release
            pick.state, ops = lost_attempt(pick.entry, pick.state, pick.payload, retry)
            if ops is not None:  # that was its last attempt: park or dead-letter it
                with contextlib.suppress(BackendUnavailable):
                    await backend.transact(ops)
                return None
        identity = {**self._source.identity, "looker": self._token}
        got = await _claiming.claim(session, self._name, self._claims, pick, identity)
        if got is None:
            return None
        hold, entry = got
        if hold.lost:
            _abandon(hold, entry, pick)
            return None
        job = Job(hold, entry, pick.state.with_(claim=None), pick.payload)
        job._acked = partial(self._acked, session, pick.entry.key)
        job._given_back = self._given_back
        return job

    def _pass_on(self, job: Job, retry: RetryPolicy) -> None:
        """A job claimed for a worker that stopped waiting: to the next one, or back."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.gone:
                waiter.job = job
                waiter.ready.set()
                return
        hold = job._hold
        hold._finish()
        release_soon(hold.session, job._entry, job._state, job.payload, hold.entry)
        self._given_back()

    # -- the idle lookers -------------------------------------------------------------------

    def _holding_slot(self) -> bool:
        return self._slot is not None and not self._slot.lost

    async def _enter_idle(self) -> None:
        """Take a place among the idle lookers; return once it is one of the first
        :data:`IDLE_WATCHERS` (or nobody waits any more)."""
        await self._leave_idle()  # a slot lost with its session
        with anyio.CancelScope() as self._watching:
            if self._waiters:
                self._slot = await self._idle.acquire()
        self._watching = None

    async def _leave_idle(self) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        with anyio.CancelScope(shield=True), contextlib.suppress(LockLost, BackendError):
            await self._idle.release()


def _successors(
    jobs: Sequence[Entry],
    decode: Callable[[Entry], tuple[_records.State, bytes]],
    stocked: set[str],
) -> dict[str, tuple[Entry, int]]:
    """For each of *jobs* (oldest first) that has an ordering key and that this looker
    may ack (claimed, or in its stock: store keys *stocked*), the next of them with that
    key and its place among *jobs*, by the store key of the one before. Only those: a
    read may be the whole queue, and an idle looker keeps this (payloads and all)."""
    last: dict[str, tuple[str, bool]] = {}
    after: dict[str, tuple[Entry, int]] = {}
    for order, entry in enumerate(jobs):
        state = decode(entry)[0]
        if state.key is not None:
            before = last.get(state.key)
            if before is not None and before[1]:
                after[before[0]] = entry, order
            last[state.key] = entry.key, state.claim is not None or entry.key in stocked
    return after


def _lane(pick: _claiming.Pick, lanes: int) -> int:
    """A job's lane: a hash of its ordering key, so that one looker takes every job of a
    key while lookers contend (a key's next job is claimable only after its ack, and it
    is that looker that learns of the ack first: see Looker._acked); of its store key
    for a job without one."""
    assert pick.entry is not None
    assert pick.state is not None
    key = pick.state.key if pick.state.key is not None else pick.entry.key
    return zlib.crc32(key.encode()) % lanes


def _abandon(hold: Hold, entry: Entry, pick: _claiming.Pick) -> None:
    """Give back a claim nobody will work on (the job is claimable again at once, with
    no attempt counted)."""
    hold._finish()
    assert pick.state is not None
    release_soon(hold.session, entry, pick.state, pick.payload, hold.entry)
