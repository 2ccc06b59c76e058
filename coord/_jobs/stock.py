"""Stock: what one looker knows of the head of its queue, and which jobs it reaches for.

A looker (:mod:`coord._jobs.looker`) claims from a *stock*: the claimable jobs of its last
read of the head of the queue, oldest first, so that most claims need no read of their
own. This module is that knowledge, with no task and no waiting of its own:

* **The read** (:meth:`Stock.read`): the oldest jobs (more if none of them is claimable),
  and the live claims when they are needed (when nothing is claimable unless a claim a
  job names is dead, and at least every :data:`CLAIMS_EVERY` seconds), in that order:
  a claim made after the jobs were read fails its guard. A job that names a claim the
  claims lack is read again before its claim is taken for dead: that claim was most
  often acked between the two reads (:meth:`Stock._confirm_dead`).
* **The stock** (:meth:`Stock.refill`, :meth:`Stock.take`): up to :data:`STOCK` jobs and
  :data:`STOCK_BYTES` of payloads, read again after :data:`STOCK_FOR` seconds whatever
  is left. A stale stock is safe: each claim is guarded by the job's version as read.
* **Lanes** (:meth:`Stock.share`): after a conflict (a job another looker had first), for
  :data:`CONTENDED_FOR` seconds, only the jobs of this looker's lane: its place among the
  lookers whose claims it has seen lately (each claim names its looker), a job's lane
  being a hash of its key. So lookers in contention reach for different jobs.
* **A key's next job** (:meth:`Stock.acked`): when a job this looker claimed is acked,
  the next job of its ordering key, if the last read saw it, goes into the stock; and at
  its ack the next one, along every job of the key that read saw.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import random
import time
import uuid
from typing import TYPE_CHECKING

import anyio

from .._core import retry as _retry
from .._core.exceptions import BackendUnavailable
from ..abc import Listing
from . import claim as _claiming
from . import records as _records

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._sessions.session import Session
    from ..abc import Backend, Entry

__all__ = ["Stock"]

# A look reads this many of the oldest jobs first (then 8x more, ..., then all), so that
# a long queue whose head is claimable sends one short reply, not every job. (128 and a
# stock of 64 before ZooKeeper kept what its looks read, backends/zookeeper/_cache.py:
# since, 256/128 measured 1.07x on etcd and 1.23x on ZooKeeper at 8 workers, and 512/256
# no better. Then 512 with a stock of 128: in contention a looker keeps only its lane's
# share of a look, a quarter of it with 4 clients, and on etcd a look costs the store
# the whole queue whatever its limit: at 32 workers on etcd, reads 0.031-0.039 a job ->
# 0.020-0.025, transactions 0.65-0.68 -> 0.57, 1.07-1.13x the jobs/s; at 8 workers,
# and on ZooKeeper, no change beyond the noise; docs/benchmarks.md.)
FIRST_LOOK = 512
# A read keeps up to this many claimable jobs in stock (and up to STOCK_BYTES of their
# payloads, beyond the jobs the waiting workers need now), claimed by the next rounds
# without reading again (each claim is guarded by the job's version as read). Reads are
# what a busy queue costs the store most: etcd sorts by creation only after reading
# every key of the range, so each read of the head costs it the whole queue (0.5 reads
# a job took 2.5 ms of etcd's CPU a job with 3,000 jobs queued; a claim, 0.25 ms).
STOCK = 128
STOCK_BYTES = 1 << 20
# ... and reads again after this many seconds whatever is left of it, so that no stock
# outlives a queue emptied and refilled (a name made again may match an old version:
# see coord.abc.Update).
STOCK_FOR = 0.5
# After a conflict, lookers take jobs of their own lane for this many seconds.
CONTENDED_FOR = 2.0
# A looker whose claims were seen within this many seconds counts (see Stock.share).
LOOKERS_FOR = 3.0
# A look starts with at most this many jobs, whatever the last one had to read (see
# Stock.choose).
_FURTHEST = FIRST_LOOK * 8
# The lanes of this many lane keys are remembered (for the lookers known: see lane_of).
_OWNERS_KEPT = 4 * FIRST_LOOK
# The live claims are read at least this often (seconds) while jobs are claimable.
CLAIMS_EVERY = 0.5


class Stock:
    """The stock of one looker of the queue *name*.

    :ivar token: names this looker's claims (other lookers learn their lanes from it)
    :ivar picks: the claimable jobs when last read, oldest first (by :func:`rank`)
    :ivar session: the session they were read on
    :ivar priorities: read every outstanding job at each look, to claim the highest
        priorities first: set by a Queue opened with ``priorities=True``, or on reading
        a job with a priority; for the looker's life
    """

    def __init__(self, name: str) -> None:
        self.jobs_prefix = f"{name}/_jobs/"
        self.claims_prefix = f"{name}/_claims/"
        self.token = uuid.uuid4().hex[:12]
        self.picks: list[_claiming.Pick] = []
        self.session: Session | None = None
        self.priorities = False
        self._until = 0.0  # the stock is read again after then (monotonic)
        self._lookers: list[str] = [self.token]  # the lookers seen claiming lately
        # Whose lane a job is in (see lane_of), by its lane key, for these lookers.
        self._owners: dict[str, str] = {}
        self._seen: dict[str, float] = {}  # looker token -> when last seen (monotonic)
        self._contended_until = 0.0  # lanes until then (monotonic; see share)
        self._claims_due = 0.0  # when the claims must be read again (monotonic)
        # Per job of the last read that has a key: the next job of that key read (see
        # acked), by the store key of the job before it.
        self._after: dict[str, tuple[Entry, int]] = {}
        # Claims taken to be live though the last claims read lacks them (_confirm_dead):
        # those of jobs gone since the jobs read, and newer ones that jobs now name.
        self._newer_claims: set[str] = set()
        #: Whether the last read of the jobs held a parked one (or none was made yet):
        #: then an idle looker reads the claims before the jobs too (Looker._wait_idle).
        self.parked_seen = True
        # See decode: (creation revision, version) -> header and payload, per key.
        self._decoded: dict[str, tuple[tuple[int, int], _records.State, bytes]] = {}
        # How many jobs the next read of the head asks for first (None: all), and how
        # many the last one asked for in the end (see read and choose).
        self._look: int | None = FIRST_LOOK
        self._read_to: int | None = FIRST_LOOK

    def fresh(self, session: Session) -> bool:
        """Whether the stock holds a job read on *session* and not too long ago."""
        return bool(self.picks) and self.session is session and time.monotonic() < self._until

    def forget_headers(self) -> None:
        """Hold no header cache (up to 4,096 jobs) while nobody waits; the stock itself is
        kept (bounded, read again after :data:`STOCK_FOR`): a worker that is back from its
        job a moment later claims without a read."""
        self._decoded = {}
        self._owners = {}

    async def read(self, session: Session) -> tuple[Listing, Listing | None]:
        """The oldest jobs (more if none of them is claimable), and the live claims when
        they are needed: when no job is claimable unless some claim it names is dead, and
        at least every :data:`CLAIMS_EVERY` seconds (so that the job of a dead worker is
        found while others are claimable). Without them every claim a job names is taken
        to be live, which is safe: its job is only passed over for now."""
        backend = session.backend
        limit: int | None = None if self.priorities else self._look
        for attempt in _retry.attempts():
            try:
                jobs = await backend.entries(self.jobs_prefix, limit=limit, stale_ok=True)
                claims = None
                now = time.monotonic()
                if now >= self._claims_due or not self._any_claimable(jobs, None):
                    # Read after the jobs: a claim made after the jobs were read fails
                    # its guard; one deleted after this read is seen by a watch from it.
                    claims = await backend.entries(self.claims_prefix)
                    self._claims_due = now + CLAIMS_EVERY
                    self._seen_lookers(claims)
            except BackendUnavailable:
                await _retry.backoff(attempt)
                continue
            if not self.priorities and any(_records.has_priority(e) for e in jobs.entries):
                self.priorities = True  # a job with a priority: read all
                if limit is not None:
                    limit = None
                    continue
            if claims is not None:
                try:
                    jobs = await self._confirm_dead(backend, jobs, claims)
                except BackendUnavailable:
                    await _retry.backoff(attempt)
                    continue
            if claims is not None and limit is not None and len(jobs.entries) >= limit:
                if not self._any_claimable(jobs, claims):  # none among the oldest: further
                    limit = limit * 8 if limit < FIRST_LOOK * 64 else None
                    continue
            # The headers kept are those of this read's jobs: of the whole read, not of
            # its first look alone, for the next read goes as far (with 16 keys busy
            # at 32 workers every look went further, and decoded those jobs again).
            read = {e.key for e in jobs.entries}
            self._decoded = {k: v for k, v in self._decoded.items() if k in read}
            self._read_to = limit
            return jobs, claims
        raise AssertionError("unreachable")  # pragma: no cover

    async def _confirm_dead(self, backend: Backend, jobs: Listing, claims: Listing) -> Listing:
        """*jobs*, the dead claims told from those that only seem so. A job that names a
        claim the claims (read after the jobs) lack is claimable, its claim dead, only if
        the job is unchanged since: in a busy queue the claim was most often acked
        between the two reads, and the next job of its key claimed with it (on etcd, 0.3
        such jobs a job at 32 workers over 16 keys: each claimed in vain, the stock
        dropped and the head read again, so that lookers with idle workers never went
        idle). So each such job is read again:

        * unchanged: its claim is dead, and it is claimable;
        * gone: its claim is taken to be live for this read, so that it and the next
          job of its key are passed over; the watch from the jobs' read sees it go;
        * changed: it is taken as it is now. A claim it names now that the claims read
          lacks is live if a second read of the claims has it (its end comes after the
          first, and a watch from it sees it), else dead: claimable, guarded by the
          version read now, which any ending of that claim changes."""
        self._newer_claims = set()
        live = self._live(claims)
        assert live is not None
        suspects: list[Entry] = []
        for entry in jobs.entries:
            claim = self.decode(entry)[0].claim
            if claim is not None and claim not in live:
                suspects.append(entry)
        if not suspects:
            return jobs
        now: dict[str, Entry | None] = {}
        if len(suspects) == 1:
            now[suspects[0].key] = await backend.get(suspects[0].key)
        else:
            failed: list[Exception] = []

            async def get(entry: Entry, scope: anyio.CancelScope) -> None:
                try:
                    now[entry.key] = await backend.get(entry.key)
                except Exception as exc:  # raised as itself below, not in a group
                    failed.append(exc)
                    scope.cancel()

            async with anyio.create_task_group() as tg:
                for entry in suspects:
                    tg.start_soon(get, entry, tg.cancel_scope)
            if failed:  # (BackendUnavailable: read retries)
                raise failed[0]
        changed: dict[str, Entry] = {}
        newer: set[str] = set()
        for entry in suspects:
            current = now[entry.key]
            if current is None or current.revision != entry.revision:
                claim = self.decode(entry)[0].claim
                assert claim is not None
                self._newer_claims.add(claim)  # gone: passed over, and watched
            elif current.version != entry.version:
                changed[entry.key] = current
                claim = self.decode(current)[0].claim
                if claim is not None and claim not in live:
                    newer.add(claim)
        if newer:
            again = {
                _records.id_of(e.key) for e in (await backend.entries(self.claims_prefix)).entries
            }
            self._newer_claims.update(newer.intersection(again))
        if not changed:
            return jobs
        return Listing(tuple(changed.get(e.key, e) for e in jobs.entries), jobs.revision)

    def choose(
        self, jobs: Listing, claims: Listing | None, now: float
    ) -> tuple[list[_claiming.Pick], float | None]:
        """The claimable jobs of a read (see :func:`coord._jobs.claim.choose_many`);
        notes whether any job of the read is parked (:attr:`parked_seen`), when the read
        is the whole queue's head that the claims were read for."""
        live = self._live(claims)
        if claims is not None:
            self.parked_seen = any(self.decode(e)[0].parked for e in jobs.entries)
        picks, wake_at = _claiming.choose_many(
            jobs.entries, live, now, len(jobs.entries), self.decode, priorities=self.priorities
        )
        # The next read asks first for as many jobs as this one had to (none claimable
        # among the oldest FIRST_LOOK), up to _FURTHEST: with keys busy and workers idle,
        # every look went further (its oldest jobs each hold back their key), and read,
        # confirmed and chose among those oldest twice, its claims too. Back to
        # FIRST_LOOK once one is claimable among them. Not further than _FURTHEST: the
        # first look after the head frees up reads that many (of a queue 100,000 deep, a
        # look of every job each time it did). Meanwhile a job among the oldest whose
        # claim died waits for the claims' next read (CLAIMS_EVERY) if a younger one is
        # claimable, as it does when that one is among the oldest FIRST_LOOK.
        if picks and picks[0].order < FIRST_LOOK:
            self._look = FIRST_LOOK
        elif self._read_to is None or self._read_to > FIRST_LOOK:
            self._look = min(self._read_to or _FURTHEST, _FURTHEST)
        return picks, wake_at

    def refill(
        self,
        session: Session,
        jobs: Listing,
        picks: list[_claiming.Pick],
        wake_at: float | None,
        *,
        now: float,
        busy: set[str],
        waiting: int,
    ) -> None:
        """Stock this looker's share of *picks* (claimable in the read *jobs*, on
        *session*): as many as the *waiting* workers, then more up to :data:`STOCK` jobs
        and :data:`STOCK_BYTES`; and the next job of each key it may ack. *busy*: the
        store keys workers claim meanwhile in their own tasks. Read again after
        :data:`STOCK_FOR` s (from *now*, wall clock, the time the picks were chosen at),
        or sooner when a job read comes due (delayed, or backing
        off): it may be older than the stock, and is claimed before it (put order)."""
        self.picks, self.session = _kept(self.share(picks, max(waiting, STOCK)), waiting), session
        self._after = (
            {}
            if self.priorities
            else _successors(
                jobs.entries, self.decode, busy.union(p.entry.key for p in self.picks if p.entry)
            )
        )
        due = STOCK_FOR if wake_at is None else min(STOCK_FOR, max(wake_at - now, 0.0))
        self._until = time.monotonic() + due

    def take(self, wanted: int) -> list[_claiming.Pick]:
        """Take the oldest *wanted* picks out of the stock (all of the stock after, with
        priorities: a job of higher priority may come, so each round reads)."""
        taken, self.picks = self.picks[:wanted], self.picks[wanted:]
        if self.priorities:
            self.picks = []
        return taken

    def drop(self) -> None:
        """Read the head again at the next round: a job this looker claimed was given
        back as it was, and it is older than every job of the stock (read while it was
        claimed), so a lone worker must claim it first (FIFO). Not a checkpoint."""
        self.picks = []

    def conflicted(self, conflicts: int, claims: int) -> None:
        """Another looker had some of *claims* (*conflicts* of them): learn who claims
        (its lane may be new), and read again if the stock was mostly taken meanwhile.

        A stock stocked without lanes (no conflict lately) while other lookers claim is
        cut to this looker's lane instead, at the first conflict: lookers that meet a
        conflict keep to their lanes from then on, so its own lane's jobs are as good as
        a read would give. (At 32 workers on etcd, a conflict dropped 40 picks each
        time, 0.53 a job: half the looks at the head.) Read again if its lane has none
        of them. Alone (no other looker seen claiming), a "conflict" is a claim that
        failed otherwise (the store did not answer, the job was parked on its last
        attempt): its stock is dropped as before, so that the head, read again, gives
        the oldest job first (a lone worker's FIFO)."""
        self._claims_due = 0.0
        cut = self.uncontended() and not self.priorities and len(self._lookers) > 1
        self._contended_until = time.monotonic() + CONTENDED_FOR
        if cut:
            self.picks = self._own_lane(self.picks)
        elif conflicts * 2 > claims:
            self.picks = []

    def learned(self, claims: Listing) -> None:
        """The claims read again to learn who claims (not for which are live): a stock
        cut to this looker's lane, while it contends, is cut again if the lookers
        changed (a job's lane moves only to a looker it did not know). Not a
        checkpoint."""
        lookers = self._lookers
        self._seen_lookers(claims)
        if self._lookers != lookers and not self.uncontended() and not self.priorities:
            self.picks = self._own_lane(self.picks)

    def others(self) -> bool:
        """Whether this looker saw other lookers claim lately."""
        return len(self._lookers) > 1

    def uncontended(self) -> bool:
        """Whether this looker takes the oldest jobs, whoever's lane (no conflict within
        :data:`CONTENDED_FOR` seconds)."""
        return time.monotonic() >= self._contended_until

    def acked(self, session: Session, key: str) -> None:
        """The job stored at *key*, claimed by this looker, was acked: the next job of
        its ordering key, if the last read saw it, is claimable now (unless it is
        parked, claimed or backing off). Into the stock, in
        its place by age, so that a key's jobs go on without a read of the head of the
        queue each (on etcd that costs the store the whole queue). Its lane is not
        checked: it is its key's, so the acked job's, which this looker claimed (and a
        key kept by one looker meets no other's claims). Not a checkpoint."""
        pick = self.next_of(session, key)
        self._after.pop(key, None)
        if pick is not None:
            bisect.insort(self.picks, pick, key=_claiming.rank)

    def next_of(self, session: Session, key: str) -> _claiming.Pick | None:
        """The next job of the ordering key of the job stored at *key* (this looker's,
        being acked), if the last read saw it and it is claimable once that one is gone:
        for the ack's own transaction to claim it (``Looker.ack_and_claim``), so that a
        key's jobs go on with one transaction each, and no other looker, woken by the
        ack, finds that job free. Not a checkpoint."""
        after = self._after.get(key)
        if (
            after is None
            or session is not self.session
            or time.monotonic() >= self._until
            or self.priorities
        ):
            return None
        picks, _ = _claiming.choose_many([after[0]], None, time.time(), 1, self.decode)
        if not picks:
            return None
        picks[0].order = after[1]  # its place in the read: among the stock by age
        return picks[0]

    def claimed_next(self, key: str) -> None:
        """The next job of *key*'s ordering key was claimed with its ack: not stocked at
        that ack (:meth:`acked`). Not a checkpoint."""
        self._after.pop(key, None)

    def share(self, picks: list[_claiming.Pick], most: int | None = None) -> list[_claiming.Pick]:
        """This looker's share of the claimable jobs *picks* (oldest first; the first
        *most* of it, if given). Without a conflict in the last :data:`CONTENDED_FOR`
        seconds, all of them. Else those of its lane among the lookers whose claims it
        read lately (:func:`lane_of`), so that lookers claiming at once reach for
        different jobs. Alone, that is every job, oldest first. All of them if its share
        is empty (fewer jobs than lookers)."""
        if self.uncontended() or self.priorities:
            return picks  # no conflict lately (or priorities first): the oldest first
        mine = self._own_lane(picks, most)
        if mine:
            return mine
        return sorted(random.sample(picks, min(len(picks), STOCK)), key=_claiming.rank)

    def _own_lane(
        self, picks: list[_claiming.Pick], most: int | None = None
    ) -> list[_claiming.Pick]:
        """Those of *picks* in this looker's lane (in their order; the first *most*)."""
        if len(self._lookers) == 1:
            return list(picks[:most])
        token, owners, lookers = self.token, self._owners, self._lookers
        mine = []
        for pick in picks:
            key = _lane_key(pick)
            owner = owners.get(key)
            if owner is None:
                if len(owners) >= _OWNERS_KEPT:  # (of jobs gone since, mostly)
                    owners.clear()
                owner = owners[key] = lane_of(key, lookers)
            if owner == token:
                mine.append(pick)
                if most is not None and len(mine) >= most:
                    break
        return mine

    def decode(self, entry: Entry) -> tuple[_records.State, bytes]:
        """:func:`coord._jobs.records.decode`, remembered per key, creation and version
        (a name made again may start again at an old version: see
        :class:`coord.abc.Update`): the head of a busy queue is read again and again,
        mostly unchanged. Only the jobs of the latest read are kept (see :meth:`read`)."""
        known = self._decoded.get(entry.key)
        if known is not None and known[0] == (entry.revision, entry.version):
            return known[1], known[2]
        state, payload = _records.decode(entry)
        self._decoded[entry.key] = ((entry.revision, entry.version), state, payload)
        return state, payload

    def _live(self, claims: Listing | None) -> set[str] | None:
        """The ids of the claims taken to be live: those read, and those that read lacks
        but :meth:`_confirm_dead` takes to be live; None if the claims were not read."""
        if claims is None:
            return None
        return {_records.id_of(e.key) for e in claims.entries}.union(self._newer_claims)

    def _any_claimable(self, jobs: Listing, claims: Listing | None) -> bool:
        live = self._live(claims)
        return bool(_claiming.choose_many(jobs.entries, live, time.time(), 1, self.decode)[0])

    def _seen_lookers(self, claims: Listing) -> None:
        """Note the lookers that hold claims now (their token is in the claim's value);
        those seen within :data:`LOOKERS_FOR` seconds count."""
        now = time.monotonic()
        seen = self._seen
        seen[self.token] = now
        for entry in claims.entries:
            with contextlib.suppress(ValueError, AttributeError):
                token = json.loads(entry.value).get("looker")
                # (A claim written by something else may name anything: only a token
                # that can be hashed as lanes hash them counts.)
                if isinstance(token, str) and 0 < len(token) <= 64 and token.isascii():
                    seen[token] = now
        for token in [t for t, at in seen.items() if at < now - LOOKERS_FOR]:
            del seen[token]
        lookers = sorted(seen)
        if lookers != self._lookers:
            self._lookers, self._owners = lookers, {}


def _kept(picks: list[_claiming.Pick], waiting: int) -> list[_claiming.Pick]:
    """The first of *picks* to keep in stock: as many as the *waiting* workers, then
    more up to :data:`STOCK` jobs and :data:`STOCK_BYTES` of payloads."""
    kept, size = waiting, 0
    for pick in picks[kept:STOCK]:
        size += len(pick.payload)
        if size > STOCK_BYTES:
            break
        kept += 1
    return picks[:kept]


def _successors(
    jobs: Sequence[Entry],
    decode: Callable[[Entry], tuple[_records.State, bytes]],
    stocked: set[str],
) -> dict[str, tuple[Entry, int]]:
    """For each of *jobs* (oldest first) that has an ordering key and that this looker
    may ack (claimed, or in its stock: store keys *stocked*; or the next of its key after
    such a job, which goes into the stock at that ack, and so on along the key, within
    :data:`STOCK_BYTES` of payloads), the next of them with that key and its place among
    *jobs*, by the store key of the one before. Only those: a read may be the whole queue,
    and an idle looker keeps this (payloads and all)."""
    # Per ordering key, the last job seen: its store key, and whether it is this looker's
    # to ack (claimed or stocked: True; stocked at an ack: False; else None).
    last: dict[str, tuple[str, bool | None]] = {}
    after: dict[str, tuple[Entry, int]] = {}
    size = 0  # of the payloads kept: beyond the next job of each key, up to STOCK_BYTES
    for order, entry in enumerate(jobs):
        state = decode(entry)[0]
        if state.key is None:
            continue
        mine: bool | None = True if state.claim is not None or entry.key in stocked else None
        before = last.get(state.key)
        if before is not None and before[1] is not None:
            if before[1] or size + len(entry.value) <= STOCK_BYTES:
                after[before[0]] = entry, order
                size += len(entry.value)
                mine = mine or False  # stocked at the ack of the one before
        last[state.key] = entry.key, mine
    return after


def _lane_key(pick: _claiming.Pick) -> str:
    """What decides a job's lane: its ordering key, so that one looker takes every job of
    a key while lookers contend (a key's next job is claimable only after its ack, and it
    is that looker that learns of the ack first: see Stock.acked); its store key for a
    job without one."""
    assert pick.entry is not None
    assert pick.state is not None
    return pick.state.key if pick.state.key is not None else pick.entry.key


def lane_of(key: str, lookers: Sequence[str]) -> str:
    """The looker among *lookers* (their tokens) in whose lane the jobs of the lane key
    *key* are: the one whose token, hashed with the key, scores highest (rendezvous
    hashing). Each looker knows the others from the claims it read, and two lookers
    may know different sets for a while (one not yet seen claiming, or no longer); with
    this, they disagree only about the jobs of the lookers one of them lacks, where a
    hash modulo the number of lookers (as lanes were) moved most jobs to another lane
    when that number differed (at 8 workers on etcd, a third of the lookers' refills
    were made knowing 1-3 of the 4, and most conflicts came then)."""
    data = b"\0" + key.encode("utf-8", "surrogatepass")
    # (A cryptographic hash, not a CRC: a CRC's scores of one key under several tokens
    # differ by a fixed XOR, and the lanes came out lopsided, one looker's often half
    # the jobs. Tokens are ASCII: see _seen_lookers.)
    return max(
        lookers, key=lambda token: hashlib.blake2b(token.encode() + data, digest_size=8).digest()
    )
