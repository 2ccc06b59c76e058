"""Registering ordered waiter entries on etcd: one transaction per batch, and settling a
batch whose answer was lost (the key layout and why: ``_waitqueue.py``).

A client's registrations on one prefix go out one batch at a time, by a task of the
backend: the waiters that arrived while the previous batch was in flight (up to 62, of
one lease; a batch that would cross a multiple of 64 order numbers starts at the next
one: numbers may skip, never repeat). An exclusive waiter (one that waits for the entry
right ahead of it alone: a mutex's, a writer's) gets its link too (``_waitqueue.py``). Each
batch compares the tail it read, so a conflict with another client costs a round trip,
not a wrong order; and it tries the commonest conflict, one registration of one number
in between, in the same transaction (:class:`_Guess`).

A registration whose caller stopped waiting (cancelled) or whose answer was lost
(BackendUnavailable) stays known by its waiter id until a repeat takes it over or an
abandonment (the delete of a provisional entry) undoes it: so one waiter id never has
two keys, and nothing it made is left bound to a live lease.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
from aetcd import rpc

from ..._core.exceptions import BackendError, BackendUnavailable, ClosedError, ConfigurationError
from ...abc import Entry, Position
from ._kv import _CREATE, _EQUAL, _LEASE, _MOD, _VALUE, _VERSION
from ._outcome import Outcome
from ._waitqueue import (
    BATCH,
    IDLE,
    SUB,
    SUB_BITS,
    EtcdCalls,
    WaitQueues,
    delete_op,
    drop_ops,
    entries_of,
    fence_revision,
    kill_key,
    link_key,
    order_key,
    order_of,
    ordered_end,
    queue_range,
    range_op,
    tail_key,
    tail_value,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Registrar"]

_log = logging.getLogger("coord.backends.etcd")


#: In place of the entry right before mine: the registration read that mine is the
#: queue's first key (nobody is ahead, whatever the rule).
AT_HEAD = Entry("")


#: Most waiters of a batch sent with a guess (the guess doubles its transaction).
GUESS_BATCH = 8

#: Idle tails that this client made and leaves in the store, at most (each bound to the
#: lease of the waiter that made it, so gone with that session at the latest): past it,
#: the oldest :data:`IDLE_SWEEP` go, by one transaction, each only if still untouched.
IDLE_TAILS = 1024
IDLE_SWEEP = 64


# Where a registration transaction's answers are (``Registrar._attempt``). Its own
# branch (and the guess's): the tail's put, then the n keys' puts, then the read of the
# entry ahead (``_AHEAD + n``), then with no tail the queue's first key
# (``_HEADS + n``). Its failure branch: the tail, my first key, then the guess's
# transaction (with a tail) or the queue's last key (with none). The guess's failure:
# its first key.
_AHEAD = 1
_HEADS = 2
_FAILED_TAIL = 0
_FAILED_MINE = 1
_FAILED_THIRD = 2
_GUESS_FAILED_MINE = 0


class _Plan(NamedTuple):
    """The keys a registration tries: its own, numbered from *first*, and with a *guess*
    those one number later (*first2*, *keys2*; the same when there is no guess)."""

    first: int
    keys: list[bytes]
    guess: bool
    first2: int
    keys2: list[bytes]


class _Done(NamedTuple):
    """A registration applied at *revision*, as *keys* numbered from *first*, and the
    entry ahead of its first waiter (None: to be read; ``AT_HEAD``: nobody)."""

    revision: int
    first: int
    keys: list[bytes]
    before: Entry | None


class _Tail(NamedTuple):
    """A prefix's tail as last seen: its mod revision (0: no tail), its number (with no
    tail: one below any key's, see :func:`_tail_of`), its version and its creation
    revision (0 when not known: then no guess), and whether it is *idle* (the queue is
    empty: see ``drop_ops``)."""

    mod: int
    last: int
    version: int = 0
    create: int = 0
    idle: bool = False


@dataclass(frozen=True)
class _Guess:
    """The other branch of a registration made with a tail (``Registrar._attempt``):
    taken if, since the tail read, exactly one registration took exactly one number, the
    next (the tail is then of creation *create*, version *version*, value *value*), and
    the first key of the batch's own branch is absent; mine is then *key*, numbered
    *order*."""

    create: int
    version: int
    value: int
    first: bytes  # the first key of the batch's own branch
    order: int
    key: bytes


@dataclass(frozen=True)
class _Doubt:
    """A registration sent whose answer was lost. It may still be applied: with a tail
    (*mod*, its mod revision), only while the tail has not moved, or (*guess*) while it
    is as the guess says; with none (*mod* 0), as long as no key sorts at or after
    *first* and ``kill_key(first)`` is absent."""

    mod: int
    order: int
    key: bytes
    lease: int
    first: bytes  # the first key of its batch
    guess: _Guess | None = None


@dataclass(eq=False)
class _Request:
    """One registration, from its call until its caller has its answer."""

    prefix: str
    waiter_id: str
    value: bytes
    lease: int
    #: An exclusive waiter: it gets a link (see ``_waitqueue.py``).
    link: bool
    #: (my entry, the entry right before it if known, the revision read)
    future: Outcome[tuple[Entry, Entry | None, int]]
    #: No caller waits for it (cancelled): not sent if it was not yet.
    gone: bool = False
    #: The last attempt sent, until its answer came.
    doubt: _Doubt | None = None


class Registrar:
    """The ordered registrations of one backend."""

    def __init__(self, backend: EtcdCalls, queues: WaitQueues) -> None:
        self._b = backend
        self._queues = queues
        # Last seen tail of each prefix.
        self._tails: dict[bytes, _Tail] = {}
        # The requests of each prefix not sent yet, while its sender task runs.
        self._waiting: dict[bytes, deque[_Request]] = {}
        # prefix + waiter id -> its registration, until its caller has the answer.
        self._requests: dict[str, _Request] = {}
        # The idle tails this client made (prefix -> mod revision), oldest first.
        self._idle: dict[bytes, int] = {}
        self._sweeping = False

    async def register(
        self,
        prefix: str,
        waiter_id: str,
        lease: int,
        value: bytes,
        ahead: int | None,
        kind: str | None,
    ) -> Position:
        pk = self._b._key(prefix)
        self._b._key(prefix + "@" + "0" * 16 + waiter_id)  # the length check
        ident = prefix + waiter_id
        exclusive = ahead == 1 and kind is None
        outcome = self._b._conn.event
        request = self._requests.get(ident)
        if request is not None and request.future.failed():
            # Its answer was lost: make sure it is never applied late, or find its entry.
            found = await self._settle(request.doubt, delete=False) if request.doubt else None
            del self._requests[ident]
            request = None
            if isinstance(found, Entry):  # known from now on as that entry, read below
                request = _Request(prefix, waiter_id, value, lease, exclusive, Outcome(outcome))
                request.future.set_result((found, None, 0))
                self._requests[ident] = request
        if request is None or request.future.dropped():  # else: take the earlier one over
            request = _Request(prefix, waiter_id, value, lease, exclusive, Outcome(outcome))
            self._requests[ident] = request
            self._enqueue(pk, request)
        request.gone = False
        try:
            # Shielded: a cancelled caller leaves the request's outcome to a repeat, or
            # to the abandonment that deletes what it made.
            await request.future.wait()
        except anyio.get_cancelled_exc_class():
            request.gone = True
            raise
        entry, before, revision = request.future.result()
        if (ahead == 0 and revision) or before is AT_HEAD:
            if before is AT_HEAD and kind is None:
                self._queues.first(entry)
            position = Position(entry, (), revision)
        elif ahead == 1 and kind is None and before is not None:
            position = Position(entry, (before,), revision)
        else:  # forgotten only once read: a repeat after a failed read finds the entry
            position = await self._queues.position(entry, ahead=ahead, kind=kind)
        if self._requests.get(ident) is request:
            del self._requests[ident]
        return position

    async def abandon(self, ident: str) -> bool | None:
        """Undo the registration of *ident* (prefix + waiter id) whose caller gave up:
        wait for its answer if it is in flight, then delete what it made.

        :returns: whether an entry was deleted, or None if this client knows of no such
            registration
        """
        request = self._requests.get(ident)
        if request is None:
            return None
        request.gone = True
        await request.future.wait()
        # Forgotten only once undone: a failure here leaves it for the next attempt.
        if request.future.dropped():  # never sent
            deleted = False
        elif not request.future.failed():
            deleted = await self._b.delete(request.future.result()[0])
        elif request.doubt is None:  # failed before it was sent
            deleted = False
        else:
            deleted = bool(await self._settle(request.doubt, delete=True))
        if self._requests.get(ident) is request:
            del self._requests[ident]
        return deleted

    # -- the sender ----------------------------------------------------------------------------

    def _enqueue(self, pk: bytes, request: _Request) -> None:
        # Sent by a task of the backend, never by the caller's: a caller cancelled with
        # its transaction in flight would cut the transaction, and its outcome would be
        # unknown (settled by a kill key or a move of the tail), where a task's answer
        # lets its abandonment delete what it made by key.
        waiting = self._waiting.get(pk)
        if waiting is None:
            if self._b._tg is None:
                raise ClosedError("the etcd backend is closed")
            waiting = self._waiting[pk] = deque()
            self._b._tg.start_soon(self._send, pk, waiting)
        waiting.append(request)

    async def _send(self, pk: bytes, waiting: deque[_Request]) -> None:
        batch: list[_Request] = []
        try:
            while waiting:
                batch = self._take(waiting)
                if not batch:
                    continue
                try:
                    await self._register(pk, batch)
                except Exception as exc:
                    for request in batch:
                        _fail(request, exc)
        finally:
            if self._waiting.get(pk) is waiting:
                del self._waiting[pk]
            closed = ClosedError("the etcd backend was closed")
            for request in [*batch, *waiting]:  # the batch in flight too: its doubt stays
                _fail(request, closed)

    def _take(self, waiting: deque[_Request]) -> list[_Request]:
        """The next batch: waiters of one lease, at most :data:`BATCH`, and a request well
        under the size limit (a waiter that is too big alone fails alone)."""
        batch: list[_Request] = []
        room = self._b.max_request_size // 2
        while waiting and len(batch) < BATCH:
            request = waiting[0]
            if request.gone:  # never sent: nothing happened
                waiting.popleft().future.drop()
                continue
            room -= len(request.value) + len(request.prefix) + len(request.waiter_id) + 64
            if batch and (request.lease != batch[0].lease or room < 0):
                break
            batch.append(waiting.popleft())
        return batch

    # -- one batch -----------------------------------------------------------------------------

    async def _read_tail(self, pk: bytes) -> _Tail:
        request = rpc.RangeRequest(key=tail_key(pk))
        reply = await self._b._conn.call("register", lambda c: c.kv.Range, request)
        return _tail_of(reply.kvs, reply.header.revision)

    async def _register(self, pk: bytes, batch: list[_Request]) -> None:
        """Register *batch* on the queue *pk*: send its transaction until it is applied
        (a conflict reads the tail again), then give each waiter its entry and the one
        ahead of it."""
        known = self._tails.get(pk)
        tail = known if known is not None else await self._read_tail(pk)
        while True:
            plan = self._plan(pk, batch, tail)
            try:
                reply = await self._attempt(pk, batch, plan.keys, tail, plan.first)
            except BackendUnavailable:
                if tail.mod:
                    raise
                # Made with no tail, it is not repeated inside the call: settled here, it
                # can never apply late; then it goes again, unless it was applied.
                found = await self._settle(batch[0].doubt, delete=False)  # type: ignore[arg-type]
                if isinstance(found, Entry):
                    done = _Done(found.version, plan.first, plan.keys, None)
                    break
                tail = await self._read_tail(pk)
                continue
            answered = self._answered(pk, batch, tail, plan, reply)
            if answered is not None:
                done = answered
                break
            tail = self._after_conflict(pk, reply)
        self._idle.pop(pk, None)  # registered: the tail is no longer one this client left idle
        self._grant(batch, done)

    def _plan(self, pk: bytes, batch: list[_Request], tail: _Tail) -> _Plan:
        """The keys of *batch* after *tail*, and with a tail also those one number later
        (the guess), each request's doubt set for them."""
        n = len(batch)
        first = _first(tail.last, n)
        keys = _keys(pk, batch, first)
        # With a tail, the transaction also tries the numbers after one more taken: the
        # usual conflict of clients registering on one lock together. Not with an idle
        # one: there, a conflict means that the lock has just been taken, and this waiter
        # will wait a hold anyway; the guess would double every idle acquire's
        # transaction for it.
        guess = bool(
            tail.mod and tail.create and not tail.idle and n <= GUESS_BATCH and self._small(batch)
        )
        first2 = _first(tail.last + 1, n) if guess else first
        keys2 = _keys(pk, batch, first2) if guess else keys
        for i, request in enumerate(batch):
            other = None
            if guess:
                other = _Guess(
                    tail.create, tail.version + 1, tail.last + 1, keys[0], first2 + i, keys2[i]
                )
            request.doubt = _Doubt(tail.mod, first + i, keys[i], request.lease, keys[0], other)
        return _Plan(first, keys, guess, first2, keys2)

    def _answered(
        self, pk: bytes, batch: list[_Request], tail: _Tail, plan: _Plan, reply: Any
    ) -> _Done | None:
        """What the registration transaction's *reply* says: applied (its own branch,
        the guess, or an earlier try whose answer was lost), or None: a conflict."""
        n = len(batch)
        if reply.succeeded:
            revision = reply.header.revision
            if tail.mod:  # my put of the tail: one version more
                made = _Tail(revision, plan.first + n - 1, tail.version + 1, tail.create)
            else:  # the tail made by my put
                made = _Tail(revision, plan.first + n - 1, 1, revision)
            self._remember(pk, made)
            if tail.idle:  # the queue was empty: nothing read, nobody ahead
                return _Done(revision, plan.first, plan.keys, AT_HEAD)
            before = self._ahead_of(reply.responses, n)
            heads = reply.responses[_HEADS + n].response_range.kvs if not tail.mod else ()
            if heads and bytes(heads[0].key) == plan.keys[0]:
                before = AT_HEAD
            return _Done(revision, plan.first, plan.keys, before)
        other = reply.responses[_FAILED_THIRD].response_txn if plan.guess else None
        if other is not None and other.succeeded:  # one more was taken: the guess
            revision = reply.header.revision
            made = _Tail(revision, plan.first2 + n - 1, tail.version + 2, tail.create)
            self._remember(pk, made)
            return _Done(revision, plan.first2, plan.keys2, self._ahead_of(other.responses, n))
        mine = reply.responses[_FAILED_MINE].response_range.kvs
        first, keys = plan.first, plan.keys
        if other is not None and not mine:  # (the guess's first key, in its failure)
            found = other.responses[_GUESS_FAILED_MINE].response_range.kvs
            if found and found[0].lease == batch[0].lease:
                mine, first, keys = found, plan.first2, plan.keys2
        if mine and mine[0].lease == batch[0].lease:  # a lost answer: it was applied
            self._tails.pop(pk, None)
            return _Done(mine[0].create_revision, first, keys, None)
        return None

    def _ahead_of(self, responses: Sequence[Any], n: int) -> Entry | None:
        """The entry right ahead of a batch of *n*, as its branch read it."""
        kvs = entries_of(responses[_AHEAD + n].response_range.kvs)
        return self._b._entry(kvs[-1]) if kvs else None

    def _grant(self, batch: list[_Request], done: _Done) -> None:
        """Give each waiter of *batch* its entry and the one ahead of it (the previous
        waiter of the batch, but for the first)."""
        root = len(self._b._root)
        before = done.before
        for i, (key, request) in enumerate(zip(done.keys, batch, strict=True)):
            created = fence_revision(done.revision, done.first + i)
            entry = Entry(key[root:].decode(), request.value, created, done.revision, request.lease)
            request.future.set_result((entry, before, done.revision))
            before = entry

    def _small(self, batch: list[_Request]) -> bool:
        """Whether *batch* fits twice in a request (its guess doubles it)."""
        size = sum(len(r.value) + 2 * len(r.prefix) + 2 * len(r.waiter_id) + 128 for r in batch)
        return 2 * size < self._b.max_request_size // 2

    async def _attempt(
        self, pk: bytes, batch: list[_Request], keys: list[bytes], tail: _Tail, first: int
    ) -> Any:
        """One registration transaction of *batch* as *keys*, numbered from *first*, after
        the tail read as *tail*; with its guess (``_Doubt.guess``) nested in its failure
        branch if the batch's doubts have one."""
        success = self._branch(
            pk, batch, keys, tail.last, first, heads=not tail.mod, idle=tail.idle
        )
        failure = [range_op(tail_key(pk)), range_op(keys[0])]
        if not tail.mod:  # the last key of the queue, which mine must sort after
            failure.append(range_op(keys[0], ordered_end(pk), last=True))
        guess = batch[0].doubt.guess if batch[0].doubt is not None else None
        if guess is not None:
            keys2 = [r.doubt.guess.key for r in batch if r.doubt and r.doubt.guess]
            other = rpc.TxnRequest(
                compare=_guess_compare(pk, guess),
                success=self._branch(pk, batch, keys2, guess.value, guess.order, heads=False),
                failure=[range_op(guess.key)],
            )
            failure.append(rpc.RequestOp(request_txn=other))
        # With no tail, not repeated inside the call: a first try that is only late
        # would still apply after a repeat failed, once the queue drained again. The
        # caller (_register) settles a failed one instead, then goes again.
        compare = self._compare(pk, tail.mod, keys[0])
        return await self._b._txn(
            "register", compare, success, failure=failure, retry=bool(tail.mod)
        )

    def _branch(
        self,
        pk: bytes,
        batch: list[_Request],
        keys: list[bytes],
        last: int,
        first: int,
        *,
        heads: bool,
        idle: bool = False,
    ) -> list[Any]:
        """The operations that register *batch* as *keys* (numbered from *first*) after
        the tail numbered *last*: the tail's put, my keys', a read of the one ahead
        (the tail's, if still there) unless the tail is *idle* (the queue is empty: no
        read at all), the queue's first key if *heads* (only with no tail: the queue is
        empty then, but for the waiters of a tail that left with its waiter: this
        acquire then needs no position read), and the links (but the first's on an
        idle queue: nobody is ahead of it)."""
        ops = [
            _put(tail_key(pk), tail_value(first + len(batch) - 1), batch[-1].lease),
            *(_put(k, r.value, r.lease) for k, r in zip(keys, batch, strict=True)),
        ]
        if not idle:
            ops.append(range_op(order_key(pk, last), keys[0]))
        if heads:
            head = rpc.RangeRequest(
                key=queue_range(pk)[0], range_end=keys[0] + b"\0", limit=1, keys_only=True
            )
            ops.append(rpc.RequestOp(request_range=head))
        # The links last: the reads above find the queue as it was, with my keys only.
        # None with no tail: the queue is empty then (but for rare stragglers of a tail
        # that left), so the batch's first waiter is the first entry (an idle lock's
        # acquire: a put less), and the others wait behind it and read.
        else:
            ops.extend(
                _put(link_key(pk, first + i), b"", r.lease)
                for i, r in enumerate(batch)
                if r.link and (i or not idle)
            )
        return ops

    def _compare(self, pk: bytes, mod: int, first: bytes) -> list[Any]:
        """A registration's compares, made after reading the tail at *mod*: the tail is
        unchanged; with no tail (0), also no key of the queue sorts at or after *first*
        (one whose tail went with its newest waiter may hold older keys), and the key
        that settling it makes, ``kill_key(first)``, is absent."""
        tail = rpc.Compare(key=tail_key(pk), target=_MOD, mod_revision=mod, result=_EQUAL)
        if mod:
            return [tail]
        end = ordered_end(pk)
        after = rpc.Compare(
            key=first, range_end=end, target=_CREATE, create_revision=0, result=_EQUAL
        )
        killed = rpc.Compare(key=kill_key(first), target=_CREATE, create_revision=0, result=_EQUAL)
        return [tail, after, killed]

    def _after_conflict(self, pk: bytes, reply: Any) -> _Tail:
        """The tail to number from after a failed compare."""
        responses = reply.responses
        tail = _tail_of(responses[_FAILED_TAIL].response_range.kvs, reply.header.revision)
        mod, last = tail.mod, tail.last
        # (with no tail at my attempt, the third answer is the queue's last key; with one,
        # it is the guess's transaction)
        after: Any = ()
        if len(responses) > _FAILED_THIRD and not mod:
            third = responses[_FAILED_THIRD]
            if third.WhichOneof("response") == "response_range":
                after = third.response_range.kvs
        if after:  # no tail, and a key that sorts after the first I took
            key = bytes(after[0].key)
            order = order_of(key.decode(errors="replace"))
            if order is None:  # it would fail every attempt
                raise ConfigurationError(
                    f"etcd: the key {key!r} lies among the waiter entries of its prefix but "
                    "is not one (another recipe's entries under the same name?)"
                )
            tail = _Tail(0, max(last, order))
        self._remember(pk, tail)
        return tail

    def released(self, key: bytes, order: int, tail: Any, revision: int) -> None:
        """The delete of the waiter key *key*, numbered *order*, at *revision* answered
        *tail*, its tail's
        transaction (``drop_ops``): the tail to number from. Gone if that waiter was the
        newest, or idle if it was the first too (then it is this client's); else the
        transaction's failure read it (idle and numbered as that waiter: made idle by an
        attempt of this delete whose answer was lost, so this client's too). Only a hint
        that saves a conflict: another client may register meanwhile (the guess takes one
        such registration in its stride), and the compares of the next registration
        tell."""
        pk = key[: key.rindex(b"/") + 1]
        if not tail.succeeded:
            try:
                seen = _tail_of(tail.responses[0].response_range.kvs, revision)
            except ConfigurationError:  # the next registration here says so, not this
                self._tails.pop(pk, None)
                return
            if seen.idle and seen.last == order:  # numbers are never taken twice
                self._made_idle(pk, seen.mod)
        elif tail.responses[0].WhichOneof("response") == "response_put":  # made idle
            known = self._tails.get(pk)
            seen = _Tail(revision, order, idle=True)
            if known is not None and known.last == order and known.create:  # my put's
                seen = seen._replace(version=known.version + 1, create=known.create)
            self._made_idle(pk, revision)
        else:  # gone with it: the next registration starts a new run of numbers
            seen = _tail_of((), revision)
        if pk in self._tails:
            self._remember(pk, seen)

    # -- idle tails ------------------------------------------------------------------------------

    def _made_idle(self, pk: bytes, mod: int) -> None:
        """This client left the tail of *pk* idle at *mod*: a key in the store until its
        session ends, so that the next acquire there reads nothing. A client that used
        many names keeps at most :data:`IDLE_TAILS` of them: the oldest go."""
        idle = self._idle
        idle.pop(pk, None)
        idle[pk] = mod
        if len(idle) > IDLE_TAILS and not self._sweeping and self._b._tg is not None:
            self._sweeping = True
            self._b._tg.start_soon(self._sweep)

    async def _sweep(self) -> None:
        """Delete the oldest idle tails of this client, :data:`IDLE_SWEEP` a transaction,
        until at most :data:`IDLE_TAILS` are left; each only if nobody touched it since (a
        registration since moved it: then it stays, as it should). Without its tail, the
        next registration there reads the queue's first key."""
        idle = self._idle
        try:
            while len(idle) > IDLE_TAILS:
                oldest = list(itertools.islice(idle.items(), IDLE_SWEEP))
                ops = []
                for pk, mod in oldest:
                    del idle[pk]
                    self._tails.pop(pk, None)
                    tail = tail_key(pk)
                    same = rpc.Compare(key=tail, target=_MOD, mod_revision=mod, result=_EQUAL)
                    drop = rpc.TxnRequest(compare=[same], success=[delete_op(tail)])
                    ops.append(rpc.RequestOp(request_txn=drop))
                await self._b._txn("sweep", [], ops)
        except (BackendError, ClosedError) as exc:  # left bound to their session's lease
            _log.debug("idle etcd queue tails not swept: %s", exc)
        finally:
            self._sweeping = False

    def _remember(self, pk: bytes, tail: _Tail) -> None:
        if len(self._tails) >= 4096:
            self._tails.clear()
        self._tails[pk] = tail

    # -- a lost answer ---------------------------------------------------------------------------

    async def _settle(self, doubt: _Doubt, *, delete: bool) -> Entry | bool | None:
        """Make sure the unanswered registration *doubt* is never applied later, and read
        (or, with *delete*, delete) the key it made if it was applied.

        :returns: the entry it made (None: none), or with *delete* whether one was deleted
        """
        pk = doubt.key[: doubt.key.rindex(b"/") + 1]
        made = [(doubt.key, doubt.order)]
        if doubt.guess is not None:  # or its guess's
            made.append((doubt.guess.key, doubt.guess.order))
        thens = [self._then(key, order, doubt.lease, delete=delete) for key, order in made]
        bump = rpc.RequestOp(
            request_put=rpc.PutRequest(key=tail_key(pk), ignore_value=True, ignore_lease=True)
        )
        if doubt.mod:  # it failed if the tail moved: move it (its value and lease stay)
            failure = thens
            if doubt.guess is not None:  # or if it is not as the guess says: else move it
                other = rpc.TxnRequest(
                    compare=_guess_compare(pk, doubt.guess), success=[bump], failure=thens
                )
                failure = [rpc.RequestOp(request_txn=other)]
            compare = self._compare(pk, doubt.mod, doubt.first)
            reply = await self._b._txn("register", compare, [bump], failure=failure)
            answers: list[Any] = [] if reply.succeeded else list(reply.responses)
            if answers and doubt.guess is not None:
                nested = answers[0].response_txn
                answers = [] if nested.succeeded else list(nested.responses)
        else:  # it fails once its kill key exists, bound to its lease as its keys were
            kill = _put(kill_key(doubt.first), b"", doubt.lease)
            reply = await self._b._txn("register", [], [kill, *thens])
            answers = list(reply.responses[1:])
        self._tails.pop(pk, None)
        if delete:
            return any(answer.response_txn.succeeded for answer in answers)
        for answer in answers:
            kvs = answer.response_range.kvs
            if kvs and kvs[0].lease == doubt.lease:
                return self._b._entry(kvs[0])
        return None

    @staticmethod
    def _then(key: bytes, order: int, lease: int, *, delete: bool) -> Any:
        """Read (or with *delete*, delete) the key *key* a registration on *lease* may
        have made."""
        if not delete:
            return range_op(key)
        mine = rpc.Compare(key=key, target=_LEASE, lease=lease, result=_EQUAL)
        drop = rpc.TxnRequest(compare=[mine], success=drop_ops(key, order))
        return rpc.RequestOp(request_txn=drop)


def _tail_of(kvs: Sequence[Any], revision: int) -> _Tail:
    """The tail read as *kvs* at *revision*. With no tail, its number is the one before
    the store revision read plus one, times 64: every key's number is below it, unless
    registered since (the compares then tell)."""
    if kvs:
        kv = kvs[0]
        value = bytes(kv.value)
        idle = value.endswith(IDLE)
        number = value[: -len(IDLE)] if idle else value
        if not number.isdigit():
            raise ConfigurationError(
                f"etcd: the queue tail {bytes(kv.key)!r} holds {value[:40]!r}, not an order "
                "number: a coord with another key layout uses this name (all clients of "
                "one lock must run the same layout: see the README's etcd section)"
            )
        return _Tail(kv.mod_revision, int(number), kv.version, kv.create_revision, idle)
    return _Tail(0, ((revision + 1) << SUB_BITS) - 1)


def _keys(pk: bytes, batch: list[_Request], first: int) -> list[bytes]:
    """The keys of *batch* numbered from *first*."""
    return [order_key(pk, first + i) + r.waiter_id.encode() for i, r in enumerate(batch)]


def _first(last: int, n: int) -> int:
    """The first number of a batch of *n* after the tail numbered *last*: one batch never
    crosses a multiple of 64 numbers (its fences share its store revision:
    ``fence_revision``); one that would starts at the next one."""
    first = last + 1
    if first % SUB + n > SUB:
        first += SUB - first % SUB
    return first


def _guess_compare(pk: bytes, guess: _Guess) -> list[Any]:
    """The guess's compares: the tail is the one read, one put later, and holds the next
    number (so exactly one registration of one number came in between: a settle's move
    keeps the value); and the batch's own first key is absent (else that branch was
    applied, by a repeat of the same transaction)."""
    tail = tail_key(pk)
    return [
        rpc.Compare(key=tail, target=_CREATE, create_revision=guess.create, result=_EQUAL),
        rpc.Compare(key=tail, target=_VERSION, version=guess.version, result=_EQUAL),
        rpc.Compare(key=tail, target=_VALUE, value=tail_value(guess.value), result=_EQUAL),
        rpc.Compare(key=guess.first, target=_CREATE, create_revision=0, result=_EQUAL),
    ]


def _fail(request: _Request, error: Exception) -> None:
    request.future.set_exception(error)  # (unless it has its outcome already)


def _put(key: bytes, value: bytes, lease: int) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
