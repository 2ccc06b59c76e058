"""Looker: one client's claims on one queue, made for all of its idle workers.

A worker that wants a job (``async with queue.claim()``) asks its client's looker for
the queue and waits, in a local line, for the job it is handed. The looker is one task
of the client, running while some of its workers wait:

* **Busy queue.** It claims jobs for the workers waiting, each with its own
  transaction, all at once (:func:`coord._jobs.claim.claim`: the job's header guarded
  by its version as read, the claim entry on the worker's lease); each claimed job goes
  to the worker that has waited longest. It takes them from its *stock*
  (:mod:`coord._jobs.stock`): the claimable jobs of its last read of the head of the
  queue, so most claims need no read of their own. A stock can be stale — that is safe,
  since a job claimed, acked or changed meanwhile fails its guard, and the looker reads
  again when most of a round's claims fail.
* **Lanes.** Lookers of other clients claim from the same head. After a conflict, each
  takes for a while only the jobs of its own lane (see the stock), so lookers in
  contention reach for different jobs, and nobody waits for anybody: claims scale with
  the workers, up to the store's rate of transactions.
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

import contextlib
import json
import logging
import time
import uuid
import weakref
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

import anyio

from .._core import keys as _keys
from .._core import retry as _retry
from .._core.background import declare_asyncio
from .._core.exceptions import (
    BackendError,
    BackendUnavailable,
    ClosedError,
    LockLost,
    SessionExpiredError,
)
from .._locks.semaphore import Semaphore
from ..abc import Create
from . import claim as _claiming
from . import records as _records
from .endings import lost_attempt, release_soon
from .records import Job
from .stock import Stock

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal

    from .._core.deferred import Start
    from .._locks.hold import Hold
    from .._sessions.session import Session, SessionSource
    from ..abc import Backend, Entry, Listing, Op
    from .commit import Answer
    from .endings import RetryPolicy

__all__ = ["IDLE_WATCHERS", "STOPPED_FOR", "Looker", "looker_for"]

_log = logging.getLogger("coord")

#: Idle lookers that watch the queue at once: a put wakes these, and one of them may die.
IDLE_WATCHERS = 2
#: A looker made known to the others (see Looker._contended) with no worker waiting for
#: this many seconds is known no more (and the others forget it LOOKERS_FOR seconds
#: later, as they do a looker whose claims they no longer see).
STOPPED_FOR = 1.0
# A stop check that finds less than this left withdraws (call_after may call up to 50 ms
# early: a check armed again for what is left would run again at once).
_STOP_SLACK = 0.1
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
        self._stock = Stock(name)
        self._idle = Semaphore(source, _keys.internal_name(name, "_idle"), IDLE_WATCHERS)
        self._idle._counted = False  # the lookers' turns are not the user's locks
        self._idle._loss_warned = False  # (lost with a closing client: nobody to tell)
        self._slot: Hold | None = None
        self._waiters: deque[_Waiter] = deque()
        self._running = False
        self._watching: anyio.CancelScope | None = None
        self._conflicts = 0  # claims of this round that another client had first
        # Workers claim from the stock in their own tasks when nobody waits before them
        # (see _claim_own): the store keys they are claiming, those claimed while the
        # looker read (which the read may show unclaimed), and since the last read, how
        # many they claimed and how many of those another looker had first.
        self._reading = False
        self._claiming: dict[str, None] = {}
        self._claimed_meanwhile: set[str] = set()
        self._own_claims = self._own_conflicts = 0
        self._claims_ended: anyio.Event | None = None
        # This looker's presence among the claims while it contends (see _announce):
        # the session it is made (or being made) on, and its entry once made.
        self._presence_on: Session | None = None
        self._presence: Entry | None = None
        self._announce_due = self._learn_due = self._learning = False
        self._stopped_at = 0.0  # when the looker last ended with no worker waiting
        self._stop_timer: Start | None = None  # a check of _withdraw_if_stopped, due

    def __repr__(self) -> str:
        return f"<coord.Looker {self._name!r} waiting={len(self._waiters)}>"

    @property
    def priorities(self) -> bool:
        """Whether each look reads every outstanding job, to claim the highest priorities
        first (set by a Queue opened with ``priorities=True``, or on reading a job with a
        priority; for the looker's life)."""
        return self._stock.priorities

    @priorities.setter
    def priorities(self, value: bool) -> None:
        self._stock.priorities = value

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
        declare_asyncio()  # (a task of the looker's own, and the claims it starts)
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
                self._stock.forget_headers()
                self._withdraw_if_stopped()
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
        stock = self._stock
        if not stock.fresh(session):
            self._reading, self._claimed_meanwhile = True, set()
            try:
                # Holding a place among the idle lookers, this read may end in a watch:
                # with parked jobs about, its claims from before the jobs were read (see
                # _wait_idle). Without, none (a round trip more before each claim).
                early = self._holding_slot() and stock.parked_seen
                before = await self._claims_before(session) if early else None
                jobs, claims = await stock.read(session)
            finally:
                self._reading = False
            self._own_claims = self._own_conflicts = 0
            now = time.time()
            picks, wake_at = stock.choose(jobs, claims, now)
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
                assert claims is not None  # nothing claimable: the claims were read
                if early:
                    await self._wait_idle(session.backend, jobs, before, wake_at)
                elif self._holding_slot() and stock.parked_seen:
                    return  # parked jobs: read again, the claims first (see _wait_idle)
                else:
                    await self._wait_idle(session.backend, jobs, claims, wake_at)
                return
            stock.refill(
                session, jobs, picks, wake_at, now=now, busy=busy, waiting=len(self._waiters)
            )
        self._conflicts = 0
        picks = stock.take(len(self._waiters))
        await self._claim_all(session, picks)
        if self._conflicts:
            stock.conflicted(self._conflicts, len(picks))
            self._contended(session)
        if self._conflicts < len(picks) or not self._waiters:
            # It claimed: to the back of the idle line, if it must wait again, so that
            # the idle lookers of other clients have their turn (one key's jobs, one at
            # a time, go round the clients instead of to the first two).
            await self._leave_idle()

    def _pick(self) -> tuple[Session, _claiming.Pick] | None:
        """The oldest job of a fresh stock and the session it was read on, for a worker to
        claim in its own task; None while the looker reads (or with no fresh stock)."""
        session = self._stock.session
        if (
            self._reading
            or session is None
            or session.lost
            or not session.running
            or not self._stock.fresh(session)
        ):
            return None
        return session, self._stock.picks.pop(0)

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
            self._claimed_own(key)
        self._counted(session, job is not None)
        return job

    async def ack_and_claim(
        self,
        session: Session,
        ack: list[Op],
        ended: tuple[Entry, Entry],
        late: Callable[[Answer | None], None],
    ) -> tuple[Answer | Literal["unsent"] | None, Job | None]:
        """Send *ack* (of a worker's job: its claim and job entries *ended*) with the
        claim of the worker's next job, from the stock, as one transaction
        (:func:`coord._jobs.claim.claim_with`): ``queue.run()``, whose worker claims again
        as soon as it has acked. The next job of the acked job's ordering key if the
        last read saw it (it is claimable once the ack is applied, and so in the same
        transaction: nobody else can have it first); else only when a worker back for a
        job would claim that one in its own task (:meth:`next`): nobody of its client
        waits before it, and the stock holds a job that was never claimed, read on
        *session*.

        :returns: the ack's answer ("unsent": not sent so, send it alone; None: none
            within the TTL), and the next job, claimed, or None
        """
        acked = ended[1].key
        pick = self._stock.next_of(session, acked)  # (never one claimed before)
        if pick is None:
            if self._waiters:
                return "unsent", None
            stocked = self._pick()
            if stocked is None:
                return "unsent", None
            picked_on, pick = stocked
            assert pick.entry is not None
            assert pick.state is not None
            if picked_on is not session or pick.state.claim is not None:
                self._stock.picks.insert(0, pick)  # claimed alone, after a lost attempt
                return "unsent", None
        assert pick.entry is not None
        key = pick.entry.key
        self._claiming[key] = None
        identity = {**self._source.identity, "looker": self._stock.token}
        prefix = self._stock.claims_prefix
        try:
            answer, got = await _claiming.claim_with(
                session, self._name, prefix, pick, identity, ack, ended, late
            )
        finally:
            self._claimed_own(key)
        self._counted(session, got is not None or answer in (None, "lost"))  # (else: had first)
        if got is None:
            return answer, None
        self._stock.claimed_next(acked)
        hold, entry = got
        if hold.lost:
            _abandon(hold, entry, pick)
            return answer, None
        return answer, self._job_of(session, pick, hold, entry)

    def _claimed_own(self, key: str) -> None:
        """A worker's claim of the job stored at *key*, in its own task, has ended."""
        del self._claiming[key]
        if self._reading:
            self._claimed_meanwhile.add(key)
        if not self._claiming and self._claims_ended is not None:
            self._claims_ended.set()
            self._claims_ended = None

    def _counted(self, session: Session, claimed: bool) -> None:
        """Count a claim of a worker in its own task (and a conflict, if not *claimed*)."""
        self._own_claims += 1
        if not claimed:
            self._own_conflicts += 1
            self._stock.conflicted(self._own_conflicts, self._own_claims)
            self._contended(session)

    # -- presence among the lookers in contention --------------------------------------------

    def _contended(self, session: Session) -> None:
        """Another looker had a job this one claimed: learn again who claims, and make
        this looker known to the others (once per session, until it goes idle), in a
        task of *session*. Not a checkpoint.

        Lookers learn each other from the claims they read (each claim names its
        looker), and lanes are made among those they know. A looker that others do not
        know yet holds no claim for them to see, and it loses every job of its lane to
        those who take that lane for theirs: at the start of a run, one of 4 lookers
        lost nearly every claim for 300 ms, and read the head again after each (etcd,
        8 workers). So after a conflict it makes an entry among the claims that names
        it (``@l<id>``, on its lease, no job's claim), which every looker's next read of
        the claims shows; it goes when the looker goes idle (see :meth:`_withdraw`) or
        stops (:meth:`_withdraw_if_stopped`), or with the session. First it reads the
        claims itself, at once rather than at its next read of the head, to learn of the
        others that came meanwhile (and makes itself known only if there are others)."""
        if session.lost or not session.running:
            return
        self._learn_due = True
        if self._presence_on is not session:
            self._withdraw()  # (one made on a session lost since, if any)
            self._presence_on = session
            self._announce_due = True
        if self._learning:
            return
        self._learning = True
        try:
            session.start_soon(partial(self._learn, session))
        except (ClosedError, SessionExpiredError):
            self._learning = False

    async def _learn(self, session: Session) -> None:
        stock = self._stock
        try:
            while self._learn_due and not session.lost:
                self._learn_due = False
                stock.learned(await session.backend.entries(stock.claims_prefix))
                if self._announce_due and stock.others():
                    # (Alone, a failed claim is no other's: the store did not answer,
                    # or the job was parked on its last attempt.)
                    self._announce_due = False
                    await self._announce(session)
        except (BackendError, ClosedError, SessionExpiredError):  # (the next conflict)
            _log.debug("queue %r: this looker could not learn who claims", self._name)
        except Exception:  # never into the session's task group
            _log.exception("queue %r: this looker could not learn who claims", self._name)
        finally:
            self._learning = False

    async def _announce(self, session: Session) -> None:
        stock = self._stock
        waiter_id = f"{_records.LOOKER_MARK}{uuid.uuid4().hex}"
        value = json.dumps(
            {**self._source.identity, "looker": stock.token}, separators=(",", ":")
        ).encode()
        backend = session.backend
        try:
            done = await backend.transact(
                [Create(stock.claims_prefix, waiter_id, value, session.lease)]
            )
            entry = done[0] if done is not None else None
        except BackendUnavailable as exc:  # it may have been made: look for it
            entry = await session.retry(
                partial(backend.find, stock.claims_prefix, waiter_id, session.lease), failed=exc
            )
        if entry is None:
            return
        if self._presence_on is session and self._presence is None:
            self._presence = entry
            if not self._running and not self._waiters:  # (its workers claimed alone)
                self._withdraw_if_stopped()
        else:  # it went idle (or another session came, or another was made) meanwhile
            session.discard(entry)

    def _withdraw(self) -> None:
        """This looker goes idle, or stopped: its presence goes (a looker that others
        still knew would keep a lane nobody claims from while they contend). Not a
        checkpoint."""
        session, entry = self._presence_on, self._presence
        self._presence_on = self._presence = None
        self._announce_due = False
        if self._stop_timer is not None:
            self._stop_timer.cancel()
            self._stop_timer = None
        if session is not None and entry is not None:
            session.discard(entry)  # (nothing if that session is lost: it went with it)

    def _withdraw_if_stopped(self) -> None:
        """Its looker ended with no worker waiting (all busy, or gone: a ``run()``
        drained): its presence goes if none waits within :data:`STOPPED_FOR` seconds
        of the last such end (``queue.run()``'s workers claim from the stock in their
        own tasks, and its looker ends and starts again many times a second: one timer
        at a time, on the presence's session). Not a checkpoint."""
        session = self._presence_on
        if session is None:  # (no presence: nothing to time, and no clock read)
            return
        self._stopped_at = anyio.current_time()  # (the clock of call_after's delays)
        if self._stop_timer is not None:
            return

        def check() -> None:
            self._stop_timer = None
            if self._presence_on is not session or self._running or self._waiters:
                return
            left = self._stopped_at + STOPPED_FOR - anyio.current_time()
            if left > _STOP_SLACK:  # it ran again meanwhile
                arm(left)
            else:
                self._withdraw()

        def arm(delay: float) -> None:
            assert session is not None
            with contextlib.suppress(ClosedError, SessionExpiredError):
                self._stop_timer = session.call_after(delay, check)

        arm(STOPPED_FOR)

    async def _own_claims_ended(self) -> None:
        """Wait until no worker claims in its own task (at once if none does)."""
        if self._claiming:
            if self._claims_ended is None:
                self._claims_ended = anyio.Event()
            await self._claims_ended.wait()

    async def _claims_before(self, session: Session) -> Listing | None:
        """The live claims, read before the jobs by a looker that may watch after its
        read (None if the store did not answer)."""
        try:
            return await session.backend.entries(self._stock.claims_prefix)
        except BackendUnavailable:
            return None

    async def _wait_idle(
        self, backend: Backend, jobs: Listing, claims: Listing | None, wake_at: float | None
    ) -> None:
        """Nothing is claimable: take a place among the idle lookers, or, holding one,
        watch the queue until something may have changed.

        While *jobs* holds parked jobs, the claims are watched from *claims* read before
        *jobs* (not from the claims read after them, for the guards): a claim entry that
        came and went between the two reads (an unpark's passing entry, after the jobs
        read showed its job parked) is a deletion after the jobs read, which the watch
        must see. Without parked jobs no change of a claim between the two reads is
        missed (a claim that ends is missing from the second read, and its job is read
        again: see Stock._confirm_dead), and the claims read after the jobs serves."""
        if not self._holding_slot():
            await self._enter_idle()
            return  # read again: the watch starts from a read made as a watcher
        if claims is None:  # not read before the jobs (the store did not answer): again
            await _retry.backoff(0)
            return
        with anyio.CancelScope() as self._watching:
            if self._waiters:
                await _claiming.wait_for_change(
                    backend,
                    (self._stock.jobs_prefix, jobs),
                    (self._stock.claims_prefix, claims),
                    wake_at,
                )
        self._watching = None

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
        identity = {**self._source.identity, "looker": self._stock.token}
        got = await _claiming.claim(session, self._name, self._stock.claims_prefix, pick, identity)
        if got is None:
            return None
        hold, entry = got
        if hold.lost:
            _abandon(hold, entry, pick)
            return None
        return self._job_of(session, pick, hold, entry)

    def _job_of(
        self, session: Session, pick: _claiming.Pick, hold: _claiming.ClaimHold, entry: Entry
    ) -> Job:
        """The job *pick*, claimed on *session* (*hold*; its entry as updated, *entry*)."""
        assert pick.entry is not None
        assert pick.state is not None
        job = Job(hold, entry, pick.state.with_(claim=None), pick.payload)
        job._acked = partial(self._stock.acked, session, pick.entry.key)
        job._given_back = self._stock.drop
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
        self._stock.drop()

    # -- the idle lookers -------------------------------------------------------------------

    def _holding_slot(self) -> bool:
        return self._slot is not None and not self._slot.lost

    async def _enter_idle(self) -> None:
        """Take a place among the idle lookers; return once it is one of the first
        :data:`IDLE_WATCHERS` (or nobody waits any more)."""
        await self._leave_idle()  # a slot lost with its session
        self._withdraw()
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


def _abandon(hold: Hold, entry: Entry, pick: _claiming.Pick) -> None:
    """Give back a claim nobody will work on (the job is claimable again at once, with
    no attempt counted)."""
    hold._finish()
    assert pick.state is not None
    release_soon(hold.session, entry, pick.state, pick.payload, hold.entry)
