"""Registering ordered waiter entries on etcd: one transaction per batch, and settling a
batch whose answer was lost (the key layout and why: ``_queue.py``).

A client's registrations on one prefix go out one batch at a time, by a task of the
backend: the waiters that arrived while the previous batch was in flight (up to 62, of
one lease; a batch that would cross a multiple of 64 order numbers starts at the next
one: numbers may skip, never repeat). An exclusive waiter (one that waits for the entry
right ahead of it alone: a mutex's, a writer's) gets its link too (``_queue.py``). Each
batch compares the tail it read, so a conflict with another client costs a round trip,
not a wrong order.

A registration whose caller stopped waiting (cancelled) or whose answer was lost
(BackendUnavailable) stays known by its waiter id until a repeat takes it over or an
abandonment (the delete of a provisional entry) undoes it: so one waiter id never has
two keys, and nothing it made is left bound to a live lease.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aetcd import rpc

from ..._exceptions import BackendUnavailable, ClosedError, ConfigurationError
from ...abc import Entry, Position
from ._kv import _CREATE, _EQUAL, _LEASE, _MOD
from ._queue import (
    BATCH,
    SUB,
    SUB_BITS,
    Backend,
    Queues,
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
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Registrar"]


#: In place of the entry right before mine: the registration read that mine is the
#: queue's first key (nobody is ahead, whatever the rule).
AT_HEAD = Entry("")


@dataclass(frozen=True)
class _Doubt:
    """A registration sent whose answer was lost. It may still be applied: with a tail
    (*mod*, its mod revision), only while the tail has not moved; with none (*mod* 0),
    as long as no key sorts at or after *first* and ``kill_key(first)`` is absent."""

    mod: int
    order: int
    key: bytes
    lease: int
    first: bytes  # the first key of its batch


@dataclass(eq=False)
class _Request:
    """One registration, from its call until its caller has its answer."""

    prefix: str
    waiter_id: str
    value: bytes
    lease: int
    #: An exclusive waiter: it gets a link (see ``_queue.py``).
    link: bool
    #: (my entry, the entry right before it if known, the revision read)
    future: asyncio.Future[tuple[Entry, Entry | None, int]]
    #: No caller waits for it (cancelled): not sent if it was not yet.
    gone: bool = False
    #: The last attempt sent, until its answer came.
    doubt: _Doubt | None = None


class Registrar:
    """The ordered registrations of one backend."""

    def __init__(self, backend: Backend, queues: Queues) -> None:
        self._b = backend
        self._queues = queues
        # Last seen (mod revision, newest order number) of each prefix's tail.
        self._tails: dict[bytes, tuple[int, int]] = {}
        # The requests of each prefix not sent yet, while its sender task runs.
        self._waiting: dict[bytes, deque[_Request]] = {}
        # prefix + waiter id -> its registration, until its caller has the answer.
        self._requests: dict[str, _Request] = {}

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
        loop = asyncio.get_running_loop()
        request = self._requests.get(ident)
        if request is not None and _failed(request.future):
            # Its answer was lost: make sure it is never applied late, or find its entry.
            found = await self._settle(request.doubt, delete=False) if request.doubt else None
            del self._requests[ident]
            request = None
            if isinstance(found, Entry):  # known from now on as that entry, read below
                request = _Request(prefix, waiter_id, value, lease, exclusive, loop.create_future())
                request.future.set_result((found, None, 0))
                self._requests[ident] = request
        if request is None or request.future.cancelled():  # else: take the earlier one over
            request = _Request(prefix, waiter_id, value, lease, exclusive, loop.create_future())
            self._requests[ident] = request
            self._enqueue(pk, request)
        request.gone = False
        try:
            # Shielded: a cancelled caller leaves the request's outcome to a repeat, or
            # to the abandonment that deletes what it made.
            entry, before, revision = await asyncio.shield(request.future)
        except asyncio.CancelledError:
            request.gone = True
            raise
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
        if not request.future.done():
            await asyncio.wait([request.future])
        # Forgotten only once undone: a failure here leaves it for the next attempt.
        if request.future.cancelled():  # never sent
            deleted = False
        elif request.future.exception() is None:
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
                waiting.popleft().future.cancel()
                continue
            room -= len(request.value) + len(request.prefix) + len(request.waiter_id) + 64
            if batch and (request.lease != batch[0].lease or room < 0):
                break
            batch.append(waiting.popleft())
        return batch

    # -- one batch -----------------------------------------------------------------------------

    async def _read_tail(self, pk: bytes) -> tuple[int, int]:
        request = rpc.RangeRequest(key=tail_key(pk))
        reply = await self._b._conn.call("register", lambda c: c.kv.Range, request)
        return _tail_of(reply.kvs, reply.header.revision)

    async def _register(self, pk: bytes, batch: list[_Request]) -> None:
        known = self._tails.get(pk)
        mod, last = known if known is not None else await self._read_tail(pk)
        while True:
            # One batch never crosses a multiple of 64 numbers (its fences share its
            # store revision: fence_revision): one that would starts at the next one.
            first = last + 1
            if first % SUB + len(batch) > SUB:
                first += SUB - first % SUB
            keys = [order_key(pk, first + i) + r.waiter_id.encode() for i, r in enumerate(batch)]
            for i, request in enumerate(batch):
                request.doubt = _Doubt(mod, first + i, keys[i], request.lease, keys[0])
            try:
                reply = await self._attempt(pk, batch, keys, mod, (last, first))
            except BackendUnavailable:
                if mod:
                    raise
                # Made with no tail, it is not repeated inside the call: settled here, it
                # can never apply late; then it goes again, unless it was applied.
                found = await self._settle(batch[0].doubt, delete=False)  # type: ignore[arg-type]
                if isinstance(found, Entry):
                    revision, before = found.version, None
                    break
                mod, last = await self._read_tail(pk)
                continue
            if reply.succeeded:
                revision = reply.header.revision
                self._remember(pk, (revision, first + len(batch) - 1))
                kvs = entries_of(reply.responses[1 + len(batch)].response_range.kvs)
                before = self._b._entry(kvs[-1]) if kvs else None
                heads = reply.responses[2 + len(batch)].response_range.kvs if not mod else ()
                if heads and bytes(heads[0].key) == keys[0]:
                    before = AT_HEAD
                break
            mine = reply.responses[1].response_range.kvs
            if mine and mine[0].lease == batch[0].lease:  # a lost answer: it was applied
                revision, before = mine[0].create_revision, None
                self._tails.pop(pk, None)
                break
            mod, last = self._after_conflict(pk, reply)
        root = len(self._b._root)
        for i, (key, request) in enumerate(zip(keys, batch, strict=True)):
            created = fence_revision(revision, first + i)
            entry = Entry(key[root:].decode(), request.value, created, revision, request.lease)
            if not request.future.done():
                request.future.set_result((entry, before, revision))
            before = entry

    async def _attempt(
        self, pk: bytes, batch: list[_Request], keys: list[bytes], mod: int, span: tuple[int, int]
    ) -> Any:
        tail = tail_key(pk)
        last, first = span  # the tail's number (or the guess), and the batch's first
        success = [
            _put(tail, b"%d" % (first + len(batch) - 1), batch[-1].lease),
            *(_put(k, r.value, r.lease) for k, r in zip(keys, batch, strict=True)),
            range_op(order_key(pk, last), keys[0]),  # the one ahead: the tail's, if still there
        ]
        failure = [range_op(tail), range_op(keys[0])]
        if not mod:  # the last key of the queue, which mine must sort after
            failure.append(range_op(keys[0], ordered_end(pk), last=True))
            # and on success, the queue's first key: mine if nobody is ahead (an idle
            # lock's acquire then needs no position read). Only with no tail: the queue
            # is empty then, but for the waiters of a tail that left with its waiter.
            head = rpc.RangeRequest(
                key=queue_range(pk)[0], range_end=keys[0] + b"\0", limit=1, keys_only=True
            )
            success.append(rpc.RequestOp(request_range=head))
        # The links last: the reads above find the queue as it was, with my keys only.
        # None with no tail: the queue is empty then (but for rare stragglers of a tail
        # that left), so the batch's first waiter is the first entry (an idle lock's
        # acquire: a put less), and the others wait behind it and read.
        if mod:
            success.extend(
                _put(link_key(pk, first + i), b"", r.lease) for i, r in enumerate(batch) if r.link
            )
        # With no tail, not repeated inside the call: a first try that is only late
        # would still apply after a repeat failed, once the queue drained again. The
        # caller (_register) settles a failed one instead, then goes again.
        compare = self._compare(pk, mod, keys[0])
        return await self._b._txn("register", compare, success, failure=failure, retry=bool(mod))

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

    def _after_conflict(self, pk: bytes, reply: Any) -> tuple[int, int]:
        """The tail to number from after a failed compare."""
        responses = reply.responses
        mod, last = _tail_of(responses[0].response_range.kvs, reply.header.revision)
        after = responses[2].response_range.kvs if len(responses) > 2 else ()
        if not mod and after:  # no tail, and a key that sorts after the first I took
            key = bytes(after[0].key)
            order = order_of(key.decode(errors="replace"))
            if order is None:  # it would fail every attempt
                raise ConfigurationError(
                    f"etcd: the key {key!r} lies among the waiter entries of its prefix but "
                    "is not one (another recipe's entries under the same name?)"
                )
            last = max(last, order)
        self._remember(pk, (mod, last))
        return mod, last

    def tail_dropped(self, key: bytes, revision: int) -> None:
        """The delete of the waiter key *key* at *revision* deleted its queue's tail too
        (it was the newest waiter): the tail to number from is none, as a read at that
        revision would have found. Only a guess that saves a conflict: another client
        may register meanwhile, and the compares of the next registration tell."""
        pk = key[: key.rindex(b"/") + 1]
        if pk in self._tails:
            self._remember(pk, _tail_of((), revision))

    def _remember(self, pk: bytes, tail: tuple[int, int]) -> None:
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
        mine = rpc.Compare(key=doubt.key, target=_LEASE, lease=doubt.lease, result=_EQUAL)
        drop = rpc.TxnRequest(compare=[mine], success=drop_ops(doubt.key, doubt.order))
        then = rpc.RequestOp(request_txn=drop) if delete else range_op(doubt.key)
        if doubt.mod:  # it failed if the tail moved: move it (its value and lease stay)
            bump = rpc.PutRequest(key=tail_key(pk), ignore_value=True, ignore_lease=True)
            compare = self._compare(pk, doubt.mod, doubt.first)
            reply = await self._b._txn(
                "register", compare, [rpc.RequestOp(request_put=bump)], failure=[then]
            )
            answer = None if reply.succeeded else reply.responses[0]
        else:  # it fails once its kill key exists, bound to its lease as its keys were
            kill = _put(kill_key(doubt.first), b"", doubt.lease)
            reply = await self._b._txn("register", [], [kill, then])
            answer = reply.responses[1]
        self._tails.pop(pk, None)
        if answer is None:
            return False if delete else None
        if delete:
            return bool(answer.response_txn.succeeded)
        kvs = answer.response_range.kvs
        return self._b._entry(kvs[0]) if kvs and kvs[0].lease == doubt.lease else None


def _tail_of(kvs: Sequence[Any], revision: int) -> tuple[int, int]:
    """(mod revision, newest order number) of the tail read as *kvs* at *revision*. With
    no tail, the number before the store revision read plus one, times 64: every key's
    number is below it, unless registered since (the compares then tell)."""
    if kvs:
        return kvs[0].mod_revision, int(kvs[0].value)
    return 0, ((revision + 1) << SUB_BITS) - 1


def _failed(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _fail(request: _Request, error: Exception) -> None:
    if request.future.done():
        return
    request.future.set_exception(error)
    if request.gone:  # nobody may ever ask: mark it retrieved (no "never retrieved" log)
        request.future.exception()


def _put(key: bytes, value: bytes, lease: int) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
