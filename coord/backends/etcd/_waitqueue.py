"""Waiter queues on etcd whose key order is their queue order: no request reads the queue.

A waiter's key starts with its order number, and a tail key ``P@`` holds the newest
one, so the entries ahead of a waiter are the key range that ends at its key, and the
store's work per registration and per handoff does not grow with the queue's length or
its past. Under a prefix ``P``: ``P@`` the tail (``.`` appended once idle),
``P@<order, 16 hex digits><waiter id>`` a waiter, ``P@<order>\\0`` an exclusive
waiter's link (the hand-over: :func:`drop_ops`), ``P<waiter id>`` a durable entry.
Registering is ``_register.py``'s; the layout, the registration's transactions, the
position read, the delete and the idle tail, and why each is so, are told in
``docs/design/etcd-wait-queue.md``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Protocol

from aetcd import rpc

from ..._core.exceptions import EntryGoneError
from ..._core.keys import ORDER_DIGITS, WAITER_MARK, split_order, waiter_id_of
from ...abc import Entry, Position
from ._kv import _DESCEND, _EQUAL, _VALUE, range_end

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..._core.background import BackgroundTasks
    from ._connection import Connection

__all__ = ["WaitQueues", "fence_revision", "order_of"]

_BY_KEY = rpc.RangeRequest.SortTarget.Value("KEY")
#: Most waiters registered by one transaction (etcd's --max-txn-ops is 128 by default),
#: and the room each store revision has in a fence.
SUB_BITS = 6
SUB = 1 << SUB_BITS
#: Most waiters of one registration: each may bring its link (2 puts), with the tail's
#: put and two reads, within etcd's default --max-txn-ops of 128.
BATCH = 62
#: Order numbers read at once when the waiter right ahead left out of turn.
WINDOW = 64
#: Entries remembered as the first of their queues, at most.
_FIRSTS = 65536
MARK = WAITER_MARK.encode()
#: What an idle tail's value ends with, after its number: its queue is empty.
IDLE = b"."
#: What a link key ends with, after its order number (a waiter key has its id there).
LINK = b"\0"


def order_of(key: str) -> int | None:
    """The order number of an etcd waiter key, or None for a durable entry's key."""
    return split_order(key)[0]


def fence_revision(create_revision: int, order: int) -> int:
    """The creation order of an ordered waiter entry (its :attr:`Entry.revision`, hence
    its fence): its store revision, then its place in the batch that revision registered
    (a batch never crosses a multiple of :data:`SUB` order numbers). Strictly increasing
    along the queue, and from one run of order numbers to the next."""
    return create_revision << SUB_BITS | order % SUB


# -- keys (bytes, the namespace included; pk: a prefix's key, ending in "/") ---------------


def order_key(pk: bytes, order: int) -> bytes:
    """Where the keys of order number *order* start."""
    return pk + MARK + b"%0*x" % (ORDER_DIGITS, order)


def link_key(pk: bytes, order: int) -> bytes:
    """The link of the exclusive waiter numbered *order* (right before its key)."""
    return order_key(pk, order) + LINK


def entries_of(kvs: Any) -> list[Any]:
    """The key-values of *kvs* that are entries (not links)."""
    return [kv for kv in kvs if not kv.key.endswith(LINK)]


def tail_key(pk: bytes) -> bytes:
    return pk + MARK


def kill_key(key: bytes) -> bytes:
    """The key whose existence fails the registration that would make *key* with no tail
    (``P!<order><waiter id>``: outside the queue's range, and no name's)."""
    cut = key.rindex(b"/") + 1
    return key[:cut] + b"!" + key[cut + 1 :]


def queue_range(pk: bytes) -> tuple[bytes, bytes]:
    """Every entry of the queue of *pk*, without its tail."""
    return pk + MARK + b"\0", range_end(pk + MARK)


def ordered_end(pk: bytes) -> bytes:
    """The end of the ordered keys' range (order numbers are hex digits)."""
    return pk + MARK + b"g"


def tail_value(order: int, *, idle: bool = False) -> bytes:
    """The tail's value: the newest order number, and whether the queue is empty
    (:data:`IDLE`: its newest waiter left it as the first, so nobody waits)."""
    return b"%d" % order + (IDLE if idle else b"")


def drop_ops(key: bytes, order: int, *, first: bool = False) -> list[Any]:
    """Delete the waiter key *key* and its link; if it is still the newest waiter's (the
    tail holds its number), the tail becomes *idle* if it is *first* too (the queue is
    empty then: the next registration needs no read), else it goes with it (the next
    registration starts a new run of numbers); and if it is *first* (read as the first
    entry of its queue: nothing can come ahead of it), the link numbered right after it,
    which tells that waiter it is the first now.

    Not a compare that nothing lies ahead: etcd evaluates a compare over a range by
    reading all of it, so a thousand waiters leaving out of turn would cost the store a
    million key reads, in its apply loop.

    The responses: the key's delete, then the tail's transaction (succeeded: the tail
    went, or is idle if *first*; failed: its answer is the tail read), then the links'
    deletes."""
    pk = key[: key.rindex(b"/") + 1]
    tail = tail_key(pk)
    newest = rpc.Compare(key=tail, target=_VALUE, value=tail_value(order), result=_EQUAL)
    if first:  # its value only: its lease stays that of its newest waiter, this one
        idle = rpc.PutRequest(key=tail, value=tail_value(order, idle=True), ignore_lease=True)
        then = rpc.RequestOp(request_put=idle)
    else:
        then = delete_op(tail)
    drop_tail = rpc.TxnRequest(compare=[newest], success=[then], failure=[range_op(tail)])
    ops = [delete_op(key), rpc.RequestOp(request_txn=drop_tail), delete_op(link_key(pk, order))]
    if first:
        ops.append(delete_op(link_key(pk, order + 1)))
    return ops


def range_op(key: bytes, end: bytes | None = None, *, last: bool = False) -> Any:
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


def delete_op(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


class EtcdCalls(Protocol):
    """What the queues use of the etcd backend."""

    _conn: Connection
    _root: bytes
    _tg: BackgroundTasks | None
    max_request_size: int

    @property
    def _txn(self) -> Callable[..., Awaitable[Any]]:
        """``_txn(what, compare, success, *, retry=True, failure=None)``: one Txn."""

    def _key(self, key: str) -> bytes: ...
    async def delete(self, entry: Entry) -> bool: ...
    def _entry(self, kv: Any) -> Entry: ...


class WaitQueues:
    """Where an ordered waiter entry stands, and what deletes it."""

    def __init__(self, backend: EtcdCalls) -> None:
        self._b = backend
        # The keys of the entries read as the first of their queues, until deleted (a
        # dict: insertion-ordered, so that the oldest half goes if it ever grows large,
        # e.g. with entries whose session was lost: a forgotten one only costs its
        # successor a read).
        self._firsts: dict[str, None] = {}

    def first(self, entry: Entry) -> None:
        """*entry* was read (or proven) to be the first of its queue: nothing ahead."""
        firsts = self._firsts
        if len(firsts) >= _FIRSTS:
            for key in list(itertools.islice(firsts, _FIRSTS // 2)):
                del firsts[key]
        firsts[entry.key] = None

    def forget(self, entry: Entry) -> None:
        self._firsts.pop(entry.key, None)

    def _split(self, entry: Entry) -> tuple[bytes, bytes, int]:
        key = self._b._key(entry.key)
        order = order_of(entry.key)
        assert order is not None, f"{entry.key} has no order number"
        return key, key[: key.rindex(b"/") + 1], order

    # -- position ------------------------------------------------------------------------------

    async def position(self, entry: Entry, *, ahead: int | None, kind: str | None) -> Position:
        key, pk, order = self._split(entry)
        start = queue_range(pk)[0]
        if ahead == 1 and kind is None:
            return await self._nearest(entry, key, pk, order, start)
        if ahead == 0:
            reply = await self._read(range_op(key))
            self._check_mine(entry, reply.kvs, key)
            return Position(entry, (), reply.header.revision)
        wanted = ahead + 1 if ahead is not None and kind is None else 0
        kvs, revision = await self._last_entries(start, key + b"\0", wanted)
        self._check_mine(entry, kvs[:1], key)
        found = [self._b._entry(kv) for kv in kvs[1:]]
        if kind is not None:
            found = [e for e in found if waiter_id_of(e.key).startswith(kind)]
        elif not found:
            self.first(entry)
        return Position(entry, tuple(found if ahead is None else found[:ahead]), revision)

    async def _last_entries(self, start: bytes, end: bytes, wanted: int) -> tuple[list[Any], int]:
        """The last *wanted* entries (0: all) of the range, newest first, links skipped:
        a link sorts right before its waiter, so twice as many keys are read, and all of
        them in the rare case that this found too few (links of waiters deleted by
        someone else, left until their lease ends)."""
        limit = 2 * wanted
        while True:
            request = rpc.RangeRequest(
                key=start, range_end=end, sort_order=_DESCEND, sort_target=_BY_KEY, limit=limit
            )
            reply = await self._read_range(request)
            kvs = entries_of(reply.kvs)
            if not limit or len(kvs) >= wanted or len(reply.kvs) < limit:
                return kvs[:wanted] if wanted else kvs, reply.header.revision
            limit = 0

    async def _nearest(
        self, entry: Entry, key: bytes, pk: bytes, order: int, start: bytes
    ) -> Position:
        # The nearest entry before mine within a window of order numbers, with mine: a
        # read that costs the window's keys (each number has at most a key and a link,
        # deleted ones included), never the queue's past. Only with none there, the
        # queue's first key (from the queue's start: the keys deleted since the last
        # compaction too), and then all of those ahead. The price: a waiter that became
        # the first with no hand-over proof (the waiter right ahead of it had left out of
        # turn before the first released) reads twice, where a read of the queue's first
        # key alone would do, but would walk the name's past every time.
        low = order_key(pk, max(order - WINDOW, 0))
        window = rpc.RangeRequest(
            key=low, range_end=key + b"\0", sort_order=_DESCEND, sort_target=_BY_KEY, limit=8
        )
        reply = await self._read_range(window)
        kvs, revision = entries_of(reply.kvs), reply.header.revision
        self._check_mine(entry, kvs[:1], key)
        if len(kvs) > 1:
            return Position(entry, (self._b._entry(kvs[1]),), revision)
        head = rpc.RequestOp(
            request_range=rpc.RangeRequest(
                key=start, range_end=key + b"\0", limit=1, keys_only=True
            )
        )
        reply = await self._b._conn.call(
            "position", lambda c: c.kv.Txn, rpc.TxnRequest(success=[range_op(key), head])
        )
        revision = reply.header.revision
        self._check_mine(entry, reply.responses[0].response_range.kvs, key)
        first = reply.responses[1].response_range.kvs
        # Mine, or my link (right before my key): nothing is ahead of me.
        if first and bytes(first[0].key) in (key, link_key(pk, order)):
            self.first(entry)
            return Position(entry, (), revision)
        # Waiters ahead, none within the window: the nearest of them, sorted.
        kvs, revision = await self._last_entries(start, key + b"\0", 2)
        self._check_mine(entry, kvs[:1], key)
        if len(kvs) < 2:
            self.first(entry)
            return Position(entry, (), revision)
        return Position(entry, (self._b._entry(kvs[1]),), revision)

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
        """What deletes the waiter entry *entry* (its key and link, the tail if it is
        the newest waiter's, and the next one's link if it was read as the first)."""
        key, _, order = self._split(entry)
        return drop_ops(key, order, first=entry.key in self._firsts)
