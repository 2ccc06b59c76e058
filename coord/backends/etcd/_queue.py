"""Waiter queues on etcd whose key order is their queue order: no request reads the queue.

etcd's own ``concurrency.Mutex`` finds the waiter ahead with a range sorted by creation
revision, and etcd (3.4, 3.5) answers a sorted range by reading every key of it: W waiters
cost the store O(W²), inside the apply loop when the read is part of the registering
transaction (5,000 waiters on one mutex made the server time out requests of every
tenant). Here a waiter's key starts with its *order number*, and a tail key holds the
newest one. Under a prefix ``P`` (ending in ``/``):

* ``P@`` — the tail: the newest order number, in decimal, bound to the lease of the
  waiter that took it;
* ``P@<order, 16 hex digits><waiter id>`` — a waiter entry bound to a lease. Key order is
  queue order, so the entries ahead of mine are a key range that ends at mine;
* ``P<waiter id>`` — a durable entry (a queued job): no order number, listed by creation
  revision as before.

A new key always sorts after every key of the queue: the next number is the tail's plus
one (the compare: the tail is unchanged); with no tail (the queue drained, or its newest
waiter left or lost its lease while others wait) it is the store revision read plus one,
times 64, and the compare also asks that no key of the queue sort at or after the new
one (a range that is empty unless the guess was wrong: the answer then names the last
key, to start after). Fences do not come from order numbers, which start again: an
entry's creation order (:attr:`Entry.revision`, its fence) is its store revision times
64 plus its place in its batch (:func:`fence_revision`; a batch never crosses a multiple
of 64 numbers), strictly increasing along the queue and over time.

* **register** — one transaction per batch of one client's waiters on one prefix (those
  that arrived while the previous batch was in flight, up to 64):
  ``If(Mod(tail) == m) Then(Put(tail, n+k), Put(key n+1) .. Put(key n+k), Range(order n))``.
  The range holds at most one key: the predecessor of the batch's first waiter, if it is
  still there; each next waiter's is the one before it in the batch. Another client's
  registration in between fails the compare, and the answer carries the tail: the batch
  goes again with new numbers. A batch whose answer was lost is settled before its
  waiters register again or give up: a transaction with the batch's own compares either
  fails (the batch was applied: its key is read, or deleted) or moves the tail, so that
  it can never be applied late (:meth:`Queues.settle`).
* **position** — a read-only transaction (etcd serves it as a read, outside the apply
  loop): the key right before mine together with mine (the existence check, etcd
  #11456), and the queue's first key. Only after a waiter ahead left out of turn, a window
  of 64 order numbers, and then the keys ahead sorted by key: the entries *ahead*, never
  those behind.
* **delete** — the waiter's key, and the tail with it if it is the newest waiter: nothing
  is left once the queue is empty.

The store's work per registration and per handoff is thus independent of the queue's
length; a semaphore's or a read lock's reader's read of the n nearest entries still costs
the entries ahead (a sorted range), never those behind.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aetcd import rpc

from ..._exceptions import ClosedError, EntryGoneError
from ..._keys import ORDER_DIGITS, WAITER_MARK, split_order, waiter_id_of
from ...abc import Entry, Position
from ._kv import _CREATE, _DESCEND, _EQUAL, _LEASE, _MOD, _VALUE, range_end

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from anyio.abc import TaskGroup

    from ._connection import Connection

__all__ = ["Queues", "fence_revision", "order_of"]

_BY_KEY = rpc.RangeRequest.SortTarget.Value("KEY")
#: Most waiters registered by one transaction (etcd's --max-txn-ops is 128 by default),
#: and the room each store revision has in a fence.
SUB_BITS = 6
SUB = BATCH = 1 << SUB_BITS
#: Order numbers read at once when the waiter right ahead left out of turn.
WINDOW = 64
_MARK = WAITER_MARK.encode()


def order_of(key: str) -> int | None:
    """The order number of an etcd waiter key, or None for a durable entry's key."""
    return split_order(key)[0]


@dataclass(frozen=True)
class _Doubt:
    """A registration sent whose answer was lost: it may still be applied, but only while
    the tail's mod revision is *mod*."""

    mod: int
    order: int
    key: bytes
    lease: int


@dataclass(eq=False)
class _Request:
    """One registration, from its call until its caller has its answer."""

    prefix: str
    waiter_id: str
    value: bytes
    lease: int
    #: (my entry, the entry right before it if known, the revision read)
    future: asyncio.Future[tuple[Entry, Entry | None, int]]
    #: No caller waits for it (cancelled): not sent if it was not yet.
    gone: bool = False
    #: The last attempt sent, until its answer came.
    doubt: _Doubt | None = None


class _Backend(Protocol):
    """What the queues use of the etcd backend."""

    _conn: Connection
    _root: bytes
    _tg: TaskGroup | None
    max_request_size: int

    @property
    def _txn(self) -> Callable[..., Awaitable[Any]]:
        """``_txn(what, compare, success, *, retry=True, failure=None)``: one Txn."""

    def _key(self, key: str) -> bytes: ...
    async def delete(self, entry: Entry) -> bool: ...
    def _entry(self, kv: Any) -> Entry: ...


class Queues:
    """Registration, position and deletion of the ordered waiter entries of one backend."""

    def __init__(self, backend: _Backend) -> None:
        self._b = backend
        # Last seen (mod revision, order number) of each prefix's tail; (0, 0): none.
        self._tails: dict[bytes, tuple[int, int]] = {}
        # The requests of each prefix not sent yet, while its sender task runs.
        self._waiting: dict[bytes, deque[_Request]] = {}
        # prefix + waiter id -> its registration, until its caller has the answer: a
        # repeat after a cancellation or a lost answer takes it over, an abandonment
        # (a provisional delete) undoes it.
        self._requests: dict[str, _Request] = {}

    # -- keys ------------------------------------------------------------------------------

    def _order_key(self, pk: bytes, order: int) -> bytes:
        return pk + _MARK + b"%0*x" % (ORDER_DIGITS, order)

    @staticmethod
    def _tail(pk: bytes) -> bytes:
        return pk + _MARK

    @staticmethod
    def queue_range(pk: bytes) -> tuple[bytes, bytes]:
        """Every entry of the queue of prefix key *pk*, without its tail."""
        return pk + _MARK + b"\0", range_end(pk + _MARK)

    def _split(self, entry: Entry) -> tuple[bytes, bytes, int]:
        key = self._b._key(entry.key)
        order = order_of(entry.key)
        assert order is not None, f"{entry.key} has no order number"
        return key, key[: key.rindex(b"/") + 1], order

    # -- register ----------------------------------------------------------------------------

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
        self._b._key(prefix + "@" + "0" * ORDER_DIGITS + waiter_id)  # the length check
        ident = prefix + waiter_id
        request = self._requests.get(ident)
        if request is not None and _failed(request.future):
            # Its answer was lost: make sure it is never applied late, or find its entry.
            found = await self.settle(request.doubt, delete=False) if request.doubt else None
            del self._requests[ident]
            if found is not None:
                return await self.position(found, ahead=ahead, kind=kind)
            request = None
        if request is None or request.future.cancelled():  # else: take the earlier one over
            request = _Request(
                prefix, waiter_id, value, lease, asyncio.get_running_loop().create_future()
            )
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
        del self._requests[ident]
        if ahead == 0:
            return Position(entry, (), revision)
        if ahead == 1 and kind is None and before is not None:
            return Position(entry, (before,), revision)
        return await self.position(entry, ahead=ahead, kind=kind)

    def _enqueue(self, pk: bytes, request: _Request) -> None:
        waiting = self._waiting.get(pk)
        if waiting is None:
            if self._b._tg is None:
                raise ClosedError("the etcd backend is closed")
            waiting = self._waiting[pk] = deque()
            self._b._tg.start_soon(self._send, pk, waiting)
        waiting.append(request)

    async def abandon(self, ident: str) -> bool | None:
        """Undo the registration of *ident* (prefix + waiter id) whose caller gave up:
        wait for its answer if it is in flight, then delete what it made.

        :returns: whether an entry was deleted, or None if this client knows of no such
            registration
        """
        request = self._requests.pop(ident, None)
        if request is None:
            return None
        request.gone = True
        if not request.future.done():
            await asyncio.wait([request.future])
        if request.future.cancelled():  # never sent
            return False
        if request.future.exception() is None:
            entry = request.future.result()[0]
            return await self._b.delete(entry)
        if request.doubt is None:  # failed before it was sent
            return False
        await self.settle(request.doubt, delete=True)
        return True

    async def _send(self, pk: bytes, waiting: deque[_Request]) -> None:
        batch: list[_Request] = []
        try:
            while waiting:
                batch = self._take(waiting)
                if not batch:
                    continue
                try:
                    await self._register(pk, batch, waiting)
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

    async def _register(self, pk: bytes, batch: list[_Request], waiting: deque[_Request]) -> None:
        tail = self._tail(pk)
        known = self._tails.get(pk)
        if known is None:
            request = rpc.RangeRequest(key=tail)
            known = self._tail_of(
                await self._b._conn.call("register", lambda c: c.kv.Range, request)
            )
        mod, last = known
        while True:
            first = last + 1
            # One batch never crosses a multiple of 64: its waiters' fences are its store
            # revision << 6 | order % 64 (see fence_revision); the rest go next.
            room = SUB - first % SUB
            while len(batch) > room:
                waiting.appendleft(batch.pop())
            keys = [
                self._order_key(pk, first + i) + r.waiter_id.encode() for i, r in enumerate(batch)
            ]
            for i, request in enumerate(batch):
                request.doubt = _Doubt(mod, first + i, keys[i], request.lease)
            success = [
                _put(tail, b"%d" % (first + len(batch) - 1), batch[-1].lease),
                *(_put(k, r.value, r.lease) for k, r in zip(keys, batch, strict=True)),
                _range(self._order_key(pk, first - 1), self._order_key(pk, first)),
            ]
            failure = [_range(tail), _range(keys[0])]
            if mod == 0:  # failed: the last key of the queue, which mine must sort after
                failure.append(_range(keys[0], self._ordered_end(pk), last=True))
            reply = await self._b._txn(
                "register", self._compare(pk, mod, keys[0]), success, failure=failure
            )
            if reply.succeeded:
                revision = reply.header.revision
                self._remember(pk, (revision, first + len(batch) - 1))
                kvs = reply.responses[-1].response_range.kvs
                before = self._b._entry(kvs[-1]) if kvs else None
                break
            mine = reply.responses[1].response_range.kvs
            if mine and mine[0].lease == batch[0].lease:  # a lost answer: it was applied
                revision, before = mine[0].create_revision, None
                self._tails.pop(pk, None)
                break
            mod, last = self._tail_of(reply, 0)
            after = reply.responses[2].response_range.kvs if len(reply.responses) > 2 else ()
            if not mod and after:  # no tail, and keys with higher numbers than I took
                last = max(last, order_of(bytes(after[0].key).decode()) or 0)
            self._remember(pk, (mod, last))
        root = len(self._b._root)
        for i, (key, request) in enumerate(zip(keys, batch, strict=True)):
            entry = Entry(
                key[root:].decode(),
                request.value,
                fence_revision(revision, first + i),
                revision,
                request.lease,
            )
            if not request.future.done():
                request.future.set_result((entry, before, revision))
            before = entry

    def _compare(self, pk: bytes, mod: int, first: bytes) -> list[Any]:
        """The compares of a registration whose first key is *first*, made after reading
        the tail at mod revision *mod*: the tail is unchanged; with no tail (0), also no
        key of the queue sorts at or after *first* (a queue whose tail went with its
        newest waiter may hold older keys: mine must come after them)."""
        tail = rpc.Compare(key=self._tail(pk), target=_MOD, mod_revision=mod, result=_EQUAL)
        if mod:
            return [tail]
        end = self._ordered_end(pk)
        after = rpc.Compare(
            key=first, range_end=end, target=_CREATE, create_revision=0, result=_EQUAL
        )
        return [tail, after]

    @staticmethod
    def _ordered_end(pk: bytes) -> bytes:
        """The end of the ordered keys' range (order numbers are hex digits)."""
        return pk + _MARK + b"g"

    def _tail_of(self, reply: Any, index: int | None = None) -> tuple[int, int]:
        """(mod revision, newest order number) of the tail in *reply*. With no tail, the
        number before the first of the store revision read plus one (every key's number
        is below it, unless it was registered since, which the compare then tells)."""
        kvs = reply.kvs if index is None else reply.responses[index].response_range.kvs
        if kvs:
            return kvs[0].mod_revision, int(kvs[0].value)
        return 0, ((reply.header.revision + 1) << SUB_BITS) - 1

    def _remember(self, pk: bytes, tail: tuple[int, int]) -> None:
        if len(self._tails) >= 4096:
            self._tails.clear()
        self._tails[pk] = tail

    async def settle(self, doubt: _Doubt, *, delete: bool) -> Entry | None:
        """Make sure the unanswered registration *doubt* is never applied later: move the
        tail past its compare if it was not applied, else read (or delete) its key.

        :returns: the entry it made, if it made one and *delete* is false
        """
        pk = doubt.key[: doubt.key.rindex(b"/") + 1]
        tail = self._tail(pk)
        if doubt.mod:  # the tail moves; its value and lease stay
            bump = rpc.PutRequest(key=tail, ignore_value=True, ignore_lease=True)
        else:  # its compares hold: no key sorts at or after its key, so its number is
            # above every key's, and it is made a tail (which fails the compares)
            bump = rpc.PutRequest(key=tail, value=b"%d" % doubt.order, lease=doubt.lease)
        mine = rpc.Compare(key=doubt.key, target=_LEASE, lease=doubt.lease, result=_EQUAL)
        drop = rpc.TxnRequest(compare=[mine], success=[_delete(doubt.key)])
        reply = await self._b._txn(
            "register",
            self._compare(pk, doubt.mod, doubt.key),
            [rpc.RequestOp(request_put=bump)],
            failure=[rpc.RequestOp(request_txn=drop) if delete else _range(doubt.key)],
        )
        self._tails.pop(pk, None)
        if reply.succeeded or delete:
            return None
        kvs = reply.responses[0].response_range.kvs
        return self._b._entry(kvs[0]) if kvs and kvs[0].lease == doubt.lease else None

    # -- position ------------------------------------------------------------------------------

    async def position(self, entry: Entry, *, ahead: int | None, kind: str | None) -> Position:
        key, pk, order = self._split(entry)
        start = self.queue_range(pk)[0]
        if ahead == 1 and kind is None:
            return await self._nearest(entry, key, pk, order, start)
        if ahead == 0:
            reply = await self._read(_range(key))
            self._check_mine(entry, reply.kvs, key)
            return Position(entry, (), reply.header.revision)
        limit = ahead + 1 if ahead is not None and kind is None else 0
        request = rpc.RangeRequest(
            key=start, range_end=key + b"\0", sort_order=_DESCEND, sort_target=_BY_KEY, limit=limit
        )
        reply = await self._read_range(request)
        self._check_mine(entry, reply.kvs[:1], key)
        found = [self._b._entry(kv) for kv in reply.kvs[1:]]
        if kind is not None:
            found = [e for e in found if waiter_id_of(e.key).startswith(kind)]
        return Position(
            entry, tuple(found if ahead is None else found[:ahead]), reply.header.revision
        )

    async def _nearest(
        self, entry: Entry, key: bytes, pk: bytes, order: int, start: bytes
    ) -> Position:
        # The key right before mine, with mine; and the first key of the queue.
        window = _range(self._order_key(pk, order - 1), key + b"\0")
        head = rpc.RequestOp(
            request_range=rpc.RangeRequest(
                key=start, range_end=key + b"\0", limit=1, keys_only=True
            )
        )
        reply = await self._b._conn.call(
            "position", lambda c: c.kv.Txn, rpc.TxnRequest(success=[window, head])
        )
        revision = reply.header.revision
        kvs = reply.responses[0].response_range.kvs
        self._check_mine(entry, kvs[-1:], key)
        if len(kvs) > 1:
            return Position(entry, (self._b._entry(kvs[-2]),), revision)
        first = reply.responses[1].response_range.kvs
        if first and bytes(first[0].key) == key:
            return Position(entry, (), revision)
        # A waiter ahead left out of turn: the nearest within a window, else the
        # nearest of those ahead, sorted.
        low = self._order_key(pk, max(order - WINDOW, 0))
        reply = await self._read(_range(low, key + b"\0"))
        kvs = reply.kvs
        if len(kvs) < 2:
            request = rpc.RangeRequest(
                key=start, range_end=key + b"\0", sort_order=_DESCEND, sort_target=_BY_KEY, limit=2
            )
            reply = await self._read_range(request)
            kvs = list(reversed(reply.kvs))
        self._check_mine(entry, kvs[-1:], key)
        before = (self._b._entry(kvs[-2]),) if len(kvs) > 1 else ()
        return Position(entry, before, reply.header.revision)

    async def _read(self, op: Any) -> Any:
        return await self._read_range(op.request_range)

    async def _read_range(self, request: Any) -> Any:
        return await self._b._conn.call("position", lambda c: c.kv.Range, request)

    @staticmethod
    def _check_mine(entry: Entry, kvs: Any, key: bytes) -> None:
        if not kvs or bytes(kvs[-1].key) != key or kvs[-1].lease != entry.lease:
            raise EntryGoneError(f"{entry.key} no longer exists")

    # -- delete --------------------------------------------------------------------------------

    def release_ops(self, entry: Entry) -> list[Any]:
        """What deletes the waiter entry *entry*: its key, and the tail if it is still the
        newest waiter's (the next registration starts a new run of numbers)."""
        key, pk, order = self._split(entry)
        tail = self._tail(pk)
        newest = rpc.Compare(key=tail, target=_VALUE, value=b"%d" % order, result=_EQUAL)
        drop_tail = rpc.TxnRequest(compare=[newest], success=[_delete(tail)])
        return [_delete(key), rpc.RequestOp(request_txn=drop_tail)]


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


def _range(key: bytes, end: bytes | None = None, *, last: bool = False) -> Any:
    if last:  # the last key of the range only
        request = rpc.RangeRequest(
            key=key,
            range_end=end,
            sort_order=_DESCEND,
            sort_target=_BY_KEY,
            limit=1,
            keys_only=True,
        )
    elif end:
        request = rpc.RangeRequest(key=key, range_end=end)
    else:
        request = rpc.RangeRequest(key=key)
    return rpc.RequestOp(request_range=request)


def fence_revision(create_revision: int, order: int) -> int:
    """The creation order of an ordered waiter entry (its :attr:`Entry.revision`, hence
    its fence): its store revision, then its place in the batch that revision registered
    (a batch never crosses a multiple of :data:`SUB` order numbers). Strictly increasing
    along the queue, and from one run of order numbers to the next."""
    return create_revision << SUB_BITS | order % SUB


def _delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))
