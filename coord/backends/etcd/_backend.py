"""The etcd backend: coord's contract on etcd v3 (3.4 or later), on asyncio and trio.

The lock algorithm of etcd's own ``client/v3/concurrency``:

* register — one txn: ``If(CreateRevision(key) == 0) Then(Put(key, lease), Range(queue,
  newest first, limit n+1))``: my key is the newest entry of the queue, so the entries
  after it in that answer are the nearest ones ahead of me; nothing ahead means I am the
  head, i.e. the owner. A retried registration (lost reply) finds its key and reads its
  position instead;
* position — ``If(CreateRevision(key) == mine) Then(Range(queue, max_create_revision =
  mine - 1, newest first, limit n))``: the nearest entries ahead, *and* a check that my key
  still exists (etcd #11456), in one round trip;
* wait — a watch on exactly the predecessor, deletes only; a release wakes one waiter.
  An exclusive waiter watches from its predecessor's key to its own: the predecessor
  deleted together with the waiter's link proves it is the first now, with no read
  (``_waitqueue.py``);
* delete — ``If(CreateRevision(key) == mine) Then(Delete(key))`` (etcd #22082).

Keys are ``<namespace>/<name>/@<waiter id>``. WaitQueues are ranges ``<prefix>@`` .. so that a
nested name's keys are never part of its parent's queue.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
from aetcd import rpc

from ..._core import keys as _keys
from ..._core.background import BackgroundTasks
from ..._core.checks import check_duration
from ..._core.exceptions import ConfigurationError, EntryGoneError
from ..._core.keys import WAITER_MARK
from ..._core.url import format_url
from ...abc import Backend, Change, Check, Create, Entry, Lease, Listing, Position, Put, Update
from .._common.limits import check_key, check_ops, check_request, check_value
from .._common.probe import GRPC, first_contact
from .._common.tls import tls_files
from ._connection import Connection
from ._kv import (
    _ASCEND,
    _BY_CREATE,
    _CREATE,
    _DESCEND,
    _EQUAL,
    _LEASE,
    _MOD,
    Changes,
    range_end,
)
from ._lease import grant
from ._register import Registrar
from ._waitqueue import WaitQueues, entries_of, fence_revision, order_key, order_of, queue_range
from ._watch import Guard, HandOver, WatchCompacted, WatchStream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence

    from ..._core.url import ParsedURL
    from ...abc import Op
    from ._grpc._pipe import Event

__all__ = ["EtcdBackend"]

#: Keys read beyond those wanted by a listing with a limit (up to twice as many): more
#: than one store revision can hold (a registration of _waitqueue.BATCH waiters with
#: their links, or a transaction of max_ops creates), so that the last revision's keys,
#: which etcd may cut anywhere, can be left out with enough left (see entries). A look
#: at a queue's 256 oldest jobs reads 384 keys, not 512.
_TIE_ROOM = 128


class EtcdBackend(Backend):
    """A connection to an etcd cluster. Use it through :func:`coord.connect`::

        coord.connect("etcd://user:pw@10.0.0.1:2379,10.0.0.2:2379/myapp", ca_file="ca.pem")

    :param endpoints: ``(host, port)`` pairs; requests fail over between them
    :param namespace: prefix of every key (``"myapp"`` -> ``myapp/...``); ``""`` for none
    :param ca_file: CA bundle (PEM) to verify the servers; enables TLS
    :param cert_file: client certificate (PEM) for mutual TLS, with *key_file*
    :param key_file: the client certificate's private key (PEM)
    :param tls: use TLS with the system's CA roots when no file is given
    :param username: etcd user, with *password* (also taken from the URL)
    :param password: that user's password
    :param request_timeout: time budget in seconds of one request, retries and failovers
        included
    :param connect_timeout: how long opening the backend waits for a first answer from a
        member, in etcd's protocol (only the first connection: later ones are the
        channel's, each attempt bounded by 5 s, under each request's budget)
    """

    #: The registrar settles a registration cancelled in flight (``_register.py``).
    cheap_abandon = True
    #: etcd's own limit (``MaxLeaseTTL``, about 285 years).
    max_ttl: float = 9_000_000_000.0
    #: coord's own layout, and that of etcd's Go ``client/v3/concurrency`` (its
    #: ``Mutex`` and ``Election``, ``etcdctl lock`` and ``etcdctl elect``).
    layouts: frozenset[str] = frozenset({"coord", "etcd"})
    #: etcd's ``--max-request-bytes`` is 1.5 MiB (1,572,864) by default; a request is
    #: measured as the gRPC message sent (a Txn's compares, puts and reads).
    max_request_size: int = 1_500_000

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        namespace: str = "",
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        tls: bool = False,
        username: str | None = None,
        password: str | None = None,
        request_timeout: float = 10.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self._connect_timeout = check_duration(connect_timeout, "connect_timeout")
        request_timeout = check_duration(request_timeout, "request_timeout")
        # HTTP/2 by ALPN, as gRPC asks.
        files = tls_files(
            tls=tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file, alpn=("h2",)
        )
        self._tls = files
        self._conn = Connection(
            tuple(endpoints),
            tls=files,
            username=username,
            password=password,
            request_timeout=request_timeout,
        )
        self._root = (namespace.strip("/") + "/").encode() if namespace else b""
        self._url = format_url("etcd", endpoints, namespace, username)
        self._watches = WatchStream(self._conn)
        self._queues = WaitQueues(self)
        self._registrar = Registrar(self, self._queues)
        self._tg: BackgroundTasks | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, **options: Any) -> EtcdBackend:
        """Build from a parsed ``etcd://`` URL and keyword options (checked here)."""
        allowed = {"ca_file", "cert_file", "key_file", "tls", "request_timeout", "connect_timeout"}
        unknown = set(options) - allowed
        if unknown:
            raise ConfigurationError(
                f"unknown etcd option(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
            )
        return cls(
            url.hosts,
            namespace=url.namespace,
            username=url.username,
            password=url.password,
            **options,
        )

    @property
    def url(self) -> str:
        return self._url

    async def __aenter__(self) -> EtcdBackend:
        tls = await self._tls.probe_context() if self._tls is not None else None
        await first_contact(
            "etcd", GRPC, self._conn.endpoints, connect_timeout=self._connect_timeout, tls=tls
        )
        self._tg = BackgroundTasks()  # until aclose(), whatever scope around is cancelled
        try:
            await self._conn.open()
            await self._tg.open()
            await self._tg.start(self._watches.run)
        except BaseException:
            await self.aclose()  # (cancelled, say: no connection, no task is left)
            raise
        return self

    async def aclose(self) -> None:
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                await tg.aclose()  # raises the cancellation of a scope around the client
        finally:
            await self._conn.close()  # (shielded)

    # -- keys ----------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return self._root + check_key(key, "etcd").encode()

    def _entry(self, kv: Any) -> Entry:
        key = bytes(kv.key)[len(self._root) :].decode()
        # A waiter's creation order has room for the batch one store revision registered
        # (each waiter needs its own fencing token).
        order = order_of(key)
        revision = (
            kv.create_revision if order is None else fence_revision(kv.create_revision, order)
        )
        return Entry(key, bytes(kv.value), revision, kv.mod_revision, kv.lease)

    def _same(self, entry: Entry) -> Any:
        """The compare that *entry* still exists as the entry read (etcd #11456): its
        creation revision, or for a waiter (its key holds a waiter id used once), its lease."""
        key = self._key(entry.key)
        if order_of(entry.key) is None:
            return rpc.Compare(
                key=key, target=_CREATE, create_revision=entry.revision, result=_EQUAL
            )
        return rpc.Compare(key=key, target=_LEASE, lease=entry.lease, result=_EQUAL)

    def _queue_range(self, prefix: str, kind: str | None = None) -> tuple[bytes, bytes]:
        if kind is None:  # every entry, without the tail of the ordered ones (``<prefix>@``)
            return queue_range(self._key(prefix))
        start = self._key(prefix + kind)
        return start, range_end(start)

    async def _txn(
        self,
        what: str,
        compare: list[Any],
        success: list[Any],
        *,
        retry: bool = True,
        failure: list[Any] | None = None,
    ) -> Any:
        request = rpc.TxnRequest(compare=compare, success=success, failure=failure or [])
        check_request(request.ByteSize(), self.max_request_size, f"etcd {what}")
        return await self._conn.call(what, lambda c: c.kv.Txn, request, retry=retry)

    # -- leases --------------------------------------------------------------------------

    async def grant(self, ttl: float) -> Lease:
        assert self._tg is not None, "the backend is not open"
        lease = await grant(self._conn, ttl)
        await self._tg.start(lease.run)
        return lease

    # -- waiter entries ------------------------------------------------------------------

    def _ahead_range(
        self, prefix: str, limit: int | None, before: int = 0, kind: str | None = None
    ) -> Any:
        start, end = self._queue_range(prefix, kind)
        return rpc.RequestOp(
            request_range=rpc.RangeRequest(
                key=start,
                range_end=end,
                sort_order=_DESCEND,
                sort_target=_BY_CREATE,
                limit=limit or 0,
                max_create_revision=max(before - 1, 0),
            )
        )

    async def register(
        self,
        prefix: str,
        waiter_id: str,
        lease: Lease | None,
        *,
        value: bytes = b"",
        ahead: int | None = 1,
        kind: str | None = None,
    ) -> Position:
        check_value(value, self.max_value_size, f"register {prefix + waiter_id!r}")
        if lease is not None:  # a waiter: an ordered entry (see _queue)
            return await self._registrar.register(prefix, waiter_id, lease.id, value, ahead, kind)
        key = self._key(prefix + waiter_id)
        lease_id = 0
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id))
        # My key is the newest of the store: the newest entries of the range are mine (if
        # it is of the kind asked for) and then those ahead of me. With ahead=0 only my
        # key is read: a sorted range would cost the server the whole queue.
        counted = waiter_id.startswith(kind or WAITER_MARK) and ahead != 0
        limit = None if ahead is None else ahead + counted
        ops = [put, self._ahead_range(prefix, limit, kind=kind)] if ahead != 0 else [put]
        if not counted:
            ops.append(rpc.RequestOp(request_range=rpc.RangeRequest(key=key)))
        reply = await self._txn(
            "register",
            [rpc.Compare(key=key, target=_CREATE, create_revision=0, result=_EQUAL)],
            ops,
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        if not reply.succeeded:  # a retry found the key that an earlier attempt created
            kvs = reply.responses[0].response_range.kvs
            if not kvs:
                raise EntryGoneError(f"{prefix + waiter_id} vanished during registration")
            return await self.position(self._entry(kvs[0]), ahead=ahead, kind=kind)
        kvs = entries_of(reply.responses[1].response_range.kvs)
        mine = self._entry(kvs.pop(0) if counted else reply.responses[-1].response_range.kvs[0])
        if ahead == 0:
            kvs = []
        assert mine.key == prefix + waiter_id, "my key must be the newest of the queue"
        kvs = kvs if ahead is None else kvs[:ahead]
        return Position(mine, tuple(self._entry(kv) for kv in kvs), reply.header.revision)

    async def position(
        self, entry: Entry, *, ahead: int | None = 1, kind: str | None = None
    ) -> Position:
        if order_of(entry.key) is not None:
            return await self._queues.position(entry, ahead=ahead, kind=kind)
        key = self._key(entry.key)
        prefix = entry.key[: entry.key.rindex("/") + 1]
        ops = (
            []
            if ahead == 0
            else [self._ahead_range(prefix, ahead, before=entry.revision, kind=kind)]
        )
        reply = await self._txn(
            "position",
            [rpc.Compare(key=key, target=_CREATE, create_revision=entry.revision, result=_EQUAL)],
            ops,
        )
        if not reply.succeeded:
            raise EntryGoneError(f"{entry.key} no longer exists")
        kvs = entries_of(reply.responses[0].response_range.kvs) if ops else ()
        return Position(entry, tuple(self._entry(kv) for kv in kvs), reply.header.revision)

    async def wait_deleted(
        self, keys: Sequence[str], *, revision: int, entry: Entry | None = None
    ) -> Position | None:
        # One deletes-only guard per key and one event (the transport's kind: on asyncio
        # its own, a tenth of an anyio.Event; a waiter's memory is mostly what it waits
        # with): no task, no buffer per key.
        #
        # The guards watch from their creation, not from the revision after the caller's
        # read: etcd delivers the events of a watch that starts in the past (any write
        # since the read) only from its resync loop, every 100 ms, so a handoff waited up
        # to 100 ms. A write between the read and
        # the creation is then checked by reading the keys once (and mine, for a proof).
        wait = _Wait(len(keys), self._conn.waiter)
        handed = self._hand_over_guard(keys, entry, wait.wake, wait.on_created)
        guards: list[Guard] = (
            [handed]
            if handed is not None
            else [
                self._watches.guard(
                    self._key(key),
                    start_revision=0,
                    on_change=wait.wake,
                    on_created=wait.on_created,
                )
                for key in keys
            ]
        )
        try:
            await wait.next().wait()  # woken, or every guard created
            # Mine too, for a proof: my key deleted before the watch began (by someone
            # else: my link stays) must not be handed the queue (etcd #11456).
            mine = [entry.key] if handed is not None and entry is not None else []
            late = wait.pending <= 0 and wait.newest > revision
            if late and not wait.woken:
                if await self._any_gone([*keys, *mine], revision):
                    return None
                mine = []  # read after the creation: a deletion since is the watch's
            while not wait.woken:
                await wait.next().wait()
            # Woken as its creation was answered (one turn of the reader can take both):
            # the read above was skipped, and a proof needs it for my key.
            if late and mine and handed is not None and handed.proof:
                if await self._any_gone(mine, revision):
                    return None
        finally:
            for guard in guards:
                guard.stop()
        for guard in guards:
            # A compacted start revision only means "re-read"; any other end of a watch
            # is an error, or the caller's loop would spin on it.
            if guard.error is not None and not isinstance(guard.error, WatchCompacted):
                raise guard.error
        if handed is not None and handed.proof and entry is not None:
            self._queues.first(entry)
            return Position(entry, (), handed.proof)
        return None

    def _hand_over_guard(
        self,
        keys: Sequence[str],
        entry: Entry | None,
        wake: Callable[[], None],
        on_created: Callable[[int], None],
    ) -> HandOver | None:
        """For an exclusive waiter *entry* numbered right after the one key ahead: one
        guard from that key to mine, which tells the revision at which the key ahead and
        my link were deleted together (the hand-over of ``_waitqueue.py``), if they were."""
        if entry is None or len(keys) != 1:
            return None
        mine, before = order_of(entry.key), order_of(keys[0])
        if mine is None or before != mine - 1:
            return None
        key = self._key(entry.key)
        ahead = self._key(keys[0])
        if not ahead.startswith(order_key(key[: key.rindex(b"/") + 1], before)):
            return None
        return self._watches.hand_over(ahead, key, on_change=wake, on_created=on_created)

    async def _any_gone(self, keys: Sequence[str], revision: int) -> bool:
        """Whether one of *keys* was deleted after *revision* (one read of them all): it
        no longer exists, or a key of that name was created since (a name made again:
        the etcd layout's one key per session, taken again; waiting for the deletion of
        that new key would wait for a key created after the caller's own). A semaphore's
        waiter waits on up to 1000 keys: read in transactions of at most ``max_ops``
        reads (etcd refuses more than ``--max-txn-ops``, 128 by default)."""
        for start in range(0, len(keys), self.max_ops):
            reads = [
                rpc.RequestOp(request_range=rpc.RangeRequest(key=self._key(key), keys_only=True))
                for key in keys[start : start + self.max_ops]
            ]
            request = rpc.TxnRequest(success=reads)
            reply = await self._conn.call("wait", lambda c: c.kv.Txn, request)
            if any(
                not r.response_range.kvs or r.response_range.kvs[0].create_revision > revision
                for r in reply.responses
            ):
                return True
        return False

    def guard(
        self, key: str, *, revision: int, on_change: Callable[[], None]
    ) -> Callable[[], None]:
        # A deletes-only watch from the revision after the read, as for wait_deleted, but a
        # callback: no task, no event, no buffer per guarded key.
        return self._watches.guard(
            self._key(key), start_revision=revision + 1, on_change=on_change
        ).stop

    async def wait_changed(self, entry: Entry, *, revision: int) -> None:
        await self._any_event(self._key(entry.key), b"", revision)

    async def _any_event(self, key: bytes, end: bytes, revision: int) -> None:
        # Every event after the read counts (puts too); a compacted start revision
        # returns at once: the caller reads again, at a newer revision.
        watch = await self._watches.open(key, end, start_revision=revision + 1)
        try:
            await watch.notify.wait()
            if watch.error is not None and not isinstance(watch.error, WatchCompacted):
                raise watch.error
        finally:
            with anyio.CancelScope(shield=True):
                await watch.aclose()

    async def delete(self, entry: Entry) -> bool:
        key = self._key(entry.key)
        if entry.provisional and entry.lease:  # a registration whose caller gave up
            undone = await self._registrar.abandon(entry.key)
            if undone is not None:
                return undone
            # Not this client's, or answered: found by its waiter id (a listing).
            prefix, _, waiter_id = entry.key.rpartition("/")
            found = await self._find_ordered(prefix + "/", waiter_id, entry.lease)
            return await self.delete(found) if found is not None else False
        order = None if entry.provisional else order_of(entry.key)
        if order is not None:
            # No compare: a waiter key is made once (its waiter id is new per acquire,
            # its number too), so its delete cannot hit another entry; the tail's
            # transaction reads the tail unless it is mine (the next registration here
            # numbers from it: a client's own tail is some registrations old when others
            # register between).
            guards = []
            ops = self._queues.release_ops(entry)
        else:
            guards = [
                rpc.Compare(key=key, target=_LEASE, lease=entry.lease, result=_EQUAL)
                if entry.provisional
                else self._same(entry)
            ]
            ops = [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))]
        request = rpc.TxnRequest(compare=guards, success=ops, failure=[])
        answer = await self._conn.call_answer("delete", lambda c: c.kv.Txn, request)
        reply = answer.reply
        if order is not None:
            self._queues.forget(entry)
            tail = reply.responses[1].response_txn
            self._registrar.released(key, order, tail, reply.header.revision)
        if reply.succeeded and reply.responses[0].response_delete_range.deleted:
            return True
        # Not there: certain on a first attempt; after a repeat, the attempt whose reply
        # was lost may have deleted it.
        return answer.attempts > 1

    # -- plain keys ----------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        request = rpc.RangeRequest(key=self._key(key))
        reply = await self._conn.call("get", lambda c: c.kv.Range, request)
        return self._entry(reply.kvs[0]) if reply.kvs else None

    async def find(self, prefix: str, waiter_id: str, lease: Lease | None) -> Entry | None:
        if lease is None:
            entry = await self.get(prefix + waiter_id)
            return entry if entry is not None and entry.lease == 0 else None
        return await self._find_ordered(prefix, waiter_id, lease.id)

    async def _find_ordered(self, prefix: str, waiter_id: str, lease_id: int) -> Entry | None:
        # An ordered entry: its key starts with a number that only the listing tells.
        start, end = self._queue_range(prefix)
        request = rpc.RangeRequest(key=start, range_end=end, keys_only=True)
        reply = await self._conn.call("list", lambda c: c.kv.Range, request)
        for kv in reply.kvs:
            if kv.lease == lease_id and _keys.waiter_id_of(kv.key.decode()) == waiter_id:
                return await self.get(bytes(kv.key)[len(self._root) :].decode())
        return None

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> Entry:
        _keys.check_plain_key(key, "put")
        check_value(value, self.max_value_size, f"put {key!r}")
        k = self._key(key)
        read = [rpc.RequestOp(request_range=rpc.RangeRequest(key=k))]
        # The value goes in one branch of one request (in both branches it would take
        # twice the room): create the key, or else set it if it is still the one read.
        while True:
            absent = rpc.Compare(key=k, target=_CREATE, create_revision=0, result=_EQUAL)
            create = self._put_ops(k, value, lease, new=True)
            reply = await self._txn("put", [absent], create, failure=read)
            if not reply.succeeded:
                revision = reply.responses[0].response_range.kvs[0].create_revision
                same = rpc.Compare(key=k, target=_CREATE, create_revision=revision, result=_EQUAL)
                update = self._put_ops(k, value, lease, new=False)
                reply = await self._txn("put", [same], update)
            if reply.succeeded:
                return self._entry(reply.responses[1].response_range.kvs[0])

    def _put_ops(self, k: bytes, value: bytes, lease: Lease | None, *, new: bool) -> list[Any]:
        if new:  # this write creates the key: *lease* binds it
            put = rpc.PutRequest(key=k, value=value, lease=lease.id if lease else 0)
        else:  # an existing key keeps its lease (ZooKeeper cannot move a node either)
            put = rpc.PutRequest(key=k, value=value, ignore_lease=True)
        read = rpc.RangeRequest(key=k)
        return [rpc.RequestOp(request_put=put), rpc.RequestOp(request_range=read)]

    async def compare_and_set(
        self, key: str, value: bytes, *, version: int | None, lease: Lease | None = None
    ) -> Entry | None:
        check_value(value, self.max_value_size, f"compare_and_set {key!r}")
        k = self._key(key)
        if version is None:
            _keys.check_plain_key(key, "compare_and_set")
            compare = rpc.Compare(key=k, target=_CREATE, create_revision=0, result=_EQUAL)
        else:
            compare = rpc.Compare(key=k, target=_MOD, mod_revision=version, result=_EQUAL)
        ops = self._put_ops(k, value, lease, new=version is None)
        # Not retried: a retry after a lost reply would report our own write as a conflict.
        reply = await self._txn("compare-and-set", [compare], ops, retry=False)
        if not reply.succeeded:
            return None
        return self._entry(reply.responses[1].response_range.kvs[0])

    async def transact(self, ops: Sequence[Op]) -> tuple[Entry | None, ...] | None:
        check_ops(ops, self.max_value_size)
        compare, success = [], []
        for op in ops:
            if isinstance(op, Create):
                k = self._key(op.prefix + op.waiter_id)
                lease = op.lease.id if op.lease is not None else 0
                compare.append(rpc.Compare(key=k, target=_CREATE, create_revision=0, result=_EQUAL))
                put = rpc.PutRequest(key=k, value=op.value, lease=lease)
                success.append(rpc.RequestOp(request_put=put))
                continue
            if isinstance(op, Put):
                put = rpc.PutRequest(key=self._key(op.key), value=op.value)
                success.append(rpc.RequestOp(request_put=put))
                continue
            k = self._key(op.entry.key)
            compare.append(self._same(op.entry))
            if isinstance(op, Check):  # etcd's IsOwner(): the key exists as the same entry
                continue
            compare.append(
                rpc.Compare(key=k, target=_MOD, mod_revision=op.entry.version, result=_EQUAL)
            )
            if isinstance(op, Update):
                put = rpc.PutRequest(key=k, value=op.value, ignore_lease=True)
                success.append(rpc.RequestOp(request_put=put))
            else:
                success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=k)))
        # Not retried: a repeat after a lost reply would fail its own guards.
        reply = await self._txn("transact", compare, success, retry=False)
        if not reply.succeeded:
            return None
        rev = reply.header.revision
        results: list[Entry | None] = []
        for op in ops:
            if isinstance(op, Create):
                lease = op.lease.id if op.lease is not None else 0
                results.append(Entry(op.prefix + op.waiter_id, op.value, rev, rev, lease))
            elif isinstance(op, Update):
                e = op.entry
                results.append(Entry(e.key, op.value, e.revision, rev, e.lease))
            else:
                results.append(None)
        return tuple(results)

    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        start, end = self._queue_range(prefix)
        # Links (_waitqueue.py) are no entries: a waiter may bring one, so more keys than
        # wanted are read (twice as many, or _TIE_ROOM more), and all of them if that
        # found too few.
        wanted = limit or 0
        while True:
            over = min(2 * wanted, wanted + _TIE_ROOM)
            request = rpc.RangeRequest(
                key=start,
                range_end=end,
                sort_order=_ASCEND,
                sort_target=_BY_CREATE,
                limit=over,
                serializable=stale_ok,
            )
            reply = await self._conn.call("list", lambda c: c.kv.Range, request)
            found = entries_of(reply.kvs)
            if not wanted or len(found) >= wanted or len(reply.kvs) < over:
                break
            wanted = 0
        if wanted and reply.more and reply.kvs:
            # Waiters registered by one batch share a create revision, and etcd cuts a
            # sorted range anywhere among equals: the listing must be a prefix of the
            # queue. Without the last revision's keys (read twice as many as wanted)
            # it is, if enough are left; else read that revision's keys whole, at the
            # same revision (on etcd 3.4 a filtered range costs a scan of the prefix).
            last = reply.kvs[-1].create_revision
            whole = [kv for kv in found if kv.create_revision != last]
            if len(whole) >= wanted:
                kvs = sorted(whole, key=lambda kv: (kv.create_revision, kv.key))[:wanted]
                return Listing(tuple(self._entry(kv) for kv in kvs), reply.header.revision)
            tie = rpc.RangeRequest(
                key=start,
                range_end=end,
                min_create_revision=last,
                max_create_revision=last,
                revision=reply.header.revision,
                serializable=stale_ok,
            )
            ties = await self._conn.call("list", lambda c: c.kv.Range, tie)
            found = [kv for kv in found if kv.create_revision != last] + entries_of(ties.kvs)
        # Waiters registered by one batch share a create revision: their keys order them.
        kvs = sorted(found, key=lambda kv: (kv.create_revision, kv.key))[: limit or None]
        return Listing(tuple(self._entry(kv) for kv in kvs), reply.header.revision)

    async def names(self, prefix: str = "") -> list[str]:
        start = self._key(prefix) if prefix else self._root
        # No prefix and no namespace: the whole keyspace, which etcd spells "\0" to "\0".
        start, end = (start, range_end(start)) if start else (b"\0", b"\0")
        request = rpc.RangeRequest(key=start, range_end=end, keys_only=True)
        reply = await self._conn.call("list", lambda c: c.kv.Range, request)
        keys = _decoded(bytes(kv.key)[len(self._root) :] for kv in entries_of(reply.kvs))
        return _keys.names_of(keys, prefix)

    # -- the Go layout (client/v3/concurrency: mutex.go, election.go, key.go) ------------

    async def keys_by_creation(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        newest_first: bool = False,
        created_before: int | None = None,
    ) -> Listing:
        start, end = self._range_of(prefix)
        request = rpc.RangeRequest(
            key=start,
            range_end=end,
            sort_order=_DESCEND if newest_first else _ASCEND,
            sort_target=_BY_CREATE,
            limit=limit or 0,
            max_create_revision=max((created_before or 0) - 1, 0),
        )
        reply = await self._conn.call("list", lambda c: c.kv.Range, request)
        return Listing(tuple(map(self._entry, reply.kvs)), reply.header.revision)

    async def wait_keys_changed(self, prefix: str, *, revision: int) -> None:
        await self._any_event(*self._range_of(prefix), revision)

    def _range_of(self, prefix: str) -> tuple[bytes, bytes]:
        """Every key that starts with *prefix* (``""``: the namespace's; with no
        namespace either, the whole keyspace, which etcd spells "\\0" to "\\0")."""
        start = self._key(prefix) if prefix else self._root
        return (start, range_end(start)) if start else (b"\0", b"\0")

    @asynccontextmanager
    async def watch(self, prefix: str, *, revision: int) -> AsyncIterator[AsyncIterator[Change]]:
        start, end = self._queue_range(prefix)
        watch = await self._watches.open(start, end, start_revision=revision + 1)
        try:
            yield Changes(watch, self._entry)
        finally:
            with anyio.CancelScope(shield=True):
                await watch.aclose()

    # -- fault hooks for coord.testing -----------------------------------------------------

    async def _fault_expire_lease(self, lease_id: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        await self._conn.call("revoke", lambda c: c.lease.LeaseRevoke, request)

    async def _fault_delete_key(self, key: str) -> None:
        request = rpc.DeleteRangeRequest(key=self._key(key))
        await self._conn.call("delete", lambda c: c.kv.DeleteRange, request)

    async def _fault_compact(self) -> None:
        status = await self._conn.call("get", lambda c: c.kv.Range, rpc.RangeRequest(key=b"\0"))
        request = rpc.CompactionRequest(revision=status.header.revision, physical=True)
        await self._conn.call("compact", lambda c: c.kv.Compact, request)

    async def _fault_wakeups(self) -> int:
        from .._common.metrics import watch_messages_sent

        return await watch_messages_sent(self._conn.endpoint)


def _decoded(keys: Iterable[bytes]) -> Iterator[str]:
    """The keys that are text (others, not coord's, are skipped: a shared keyspace may
    hold anything)."""
    for key in keys:
        with suppress(UnicodeDecodeError):
            yield key.decode()


class _Wait:
    """What one :meth:`EtcdBackend.wait_deleted` waits for: a deletion (*woken*) and the
    creation of its guards (*pending* of them not yet created, the *newest* creation
    revision), on one event at a time (woken in one turn of the loop, where waiting
    for either of two takes two)."""

    __slots__ = ("_event", "_make", "newest", "pending", "woken")

    def __init__(self, guards: int, event: Callable[[], Event]) -> None:
        self.pending = guards
        self.newest = 0
        self.woken = False
        self._make = event
        self._event: Event | None = None

    def next(self) -> Event:
        """An event that the next wake or the last creation sets."""
        self._event = self._make()
        return self._event

    def _resolve(self) -> None:
        event = self._event
        if event is not None:
            event.set()

    def wake(self) -> None:
        self.woken = True
        self._resolve()

    def on_created(self, revision: int) -> None:
        self.pending -= 1
        self.newest = max(self.newest, revision)
        if self.pending <= 0:
            self._resolve()
