"""An in-process coordination store with etcd's semantics, in pure anyio.

For coord's unit tests and for users' own tests: ``coord.connect("memory://name")``. Every
client that connects to the same name in one process (and one event loop) shares one
:class:`MemoryStore`; the store is dropped when its last client closes.

Fault hooks, like kazoo's test harness:

* :meth:`MemoryStore.expire_lease` — the store expires a lease now (its keys go);
* :meth:`MemoryStore.drop_key` — someone else deletes a key;
* :meth:`MemoryBackend.stall` — the client stops sending keepalives (a paused process):
  the store expires the lease at its TTL, the client's watchdog notices at its deadline;
* :meth:`MemoryBackend.partition` — requests fail with BackendUnavailable;
* :meth:`MemoryBackend.hang` — requests get no answer until the block ends.

Every request applies its change and *then* checkpoints, so a cancelled request may well
have happened on the store, exactly like a request whose reply was lost in the network.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.lowlevel import checkpoint

from ..._core import keys as _keys
from ..._core.background import BackgroundTasks
from ..._core.exceptions import (
    BackendUnavailable,
    ClosedError,
    ConfigurationError,
    EntryGoneError,
    ResyncNeeded,
    SessionExpiredError,
)
from ...abc import (
    Backend,
    Change,
    ChangeKind,
    Check,
    Create,
    Entry,
    Lease,
    Listing,
    Position,
    Put,
)
from .._common.keepalive import KeptAliveLease
from .._common.limits import check_key, check_ops, check_request, check_value, estimate
from ._store import MemoryStore, _LeaseRecord

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence

    from ..._core.url import ParsedURL
    from ...abc import Op

__all__ = ["MemoryBackend"]


class _MemoryLease(KeptAliveLease):
    def __init__(self, backend: MemoryBackend, lease_id: int, ttl: float, sent_at: float) -> None:
        super().__init__(lease_id, ttl, sent_at=sent_at)
        self._backend = backend

    async def _refresh(self) -> float:
        return await self._backend._refresh(self.id)

    async def _revoke(self) -> None:
        await self._backend._enter()
        self._backend.store.expire_lease(self.id)
        await checkpoint()


class MemoryBackend(Backend):
    """A client of a :class:`MemoryStore`. Pure anyio: runs on asyncio and trio.

    :param store: the store to use; a fresh private one if omitted
    """

    #: A registration either made its key (found by its waiter id alone) or did not.
    cheap_abandon = True

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store: MemoryStore = store if store is not None else MemoryStore()
        self._tg: BackgroundTasks | None = None
        self._granted: list[int] = []
        self._stalled = False
        self._partitioned = False
        self._hung: anyio.Event | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, **options: object) -> MemoryBackend:
        """Build from a parsed ``memory://name`` URL: the shared store called *name*."""
        if options:
            raise ConfigurationError(f"memory:// takes no options, got {sorted(options)}")
        return cls(MemoryStore.named(url.namespace))

    @property
    def url(self) -> str:
        return f"memory://{self.store.name}"

    async def __aenter__(self) -> MemoryBackend:
        self._tg = BackgroundTasks()  # until aclose(), whatever scope around is cancelled
        await self._tg.open()
        self.store._attach()
        return self

    async def aclose(self) -> None:
        if self._tg is None:
            return
        tg, self._tg = self._tg, None
        # A client that goes away without revoking: its leases die with it (at once,
        # rather than after their TTL, so that tests stay fast and deterministic).
        for lease_id in self._granted:
            self.store.expire_lease(lease_id)
        self.store._detach()
        await tg.aclose()

    # -- fault hooks ----------------------------------------------------------------------

    async def _fault_expire_lease(self, lease_id: int) -> None:
        self.store.expire_lease(lease_id)
        await checkpoint()

    async def _fault_delete_key(self, key: str) -> None:
        self.store.drop_key(key)
        await checkpoint()

    async def _fault_compact(self) -> None:
        self.store.compacted = self.store.revision
        self.store._history.clear()
        await checkpoint()

    async def _fault_wakeups(self) -> int:
        return self.store.wakeups

    @contextmanager
    def stall(self) -> Iterator[None]:
        """Within this block no keepalive reaches the store (like a SIGSTOPped client)."""
        self._stalled = True
        try:
            yield
        finally:
            self._stalled = False

    @contextmanager
    def hang(self) -> Iterator[None]:
        """Within this block requests (keepalives included) get no answer: they wait, and
        are served when the block ends (like a SIGSTOPped store, then SIGCONT)."""
        hung = self._hung = anyio.Event()
        try:
            yield
        finally:
            self._hung = None
            hung.set()

    @contextmanager
    def partition(self) -> Iterator[None]:
        """Within this block every request fails with BackendUnavailable."""
        self._partitioned = True
        try:
            yield
        finally:
            self._partitioned = False

    # -- leases ---------------------------------------------------------------------------

    def _check_write(self, key: str, value: bytes, what: str) -> None:
        # Refused as ZooKeeper would refuse it (its limits are the tightest).
        check_value(value, self.max_value_size, f"{what} {key!r}")
        check_request(estimate([(check_key(key, what), value)]), self.max_request_size, what)

    def _check(self) -> None:
        if self._tg is None:
            raise ClosedError("the memory backend is closed")
        if self._partitioned:
            raise BackendUnavailable("memory store unreachable (partition hook)")

    async def _enter(self, *keys: str) -> None:
        """The start of every request: refused while partitioned, held while hung; a key
        over MAX_KEY_SIZE is refused first, as by every store."""
        for key in keys:
            check_key(key, "memory store")
        self._check()
        while self._hung is not None:
            await self._hung.wait()
            self._check()

    async def grant(self, ttl: float) -> Lease:
        await self._enter()
        assert self._tg is not None
        now = anyio.current_time()
        lease_id = next(self.store._lease_ids)
        self.store._leases[lease_id] = _LeaseRecord(ttl, now + ttl)
        lease = _MemoryLease(self, lease_id, ttl, now)
        self._granted.append(lease_id)
        self._tg.start_soon(self._expire_at_deadline, lease_id)
        await self._tg.start(lease.run)
        return lease

    async def _refresh(self, lease_id: int) -> float:
        await self._enter()
        if self._stalled:
            await anyio.sleep_forever()
        record = self.store._leases.get(lease_id)
        if record is None:
            return 0
        record.deadline = anyio.current_time() + record.ttl
        record.refreshed.set()
        record.refreshed = anyio.Event()
        await checkpoint()
        return record.ttl

    async def _expire_at_deadline(self, lease_id: int) -> None:
        # The store's side of a TTL: expire the lease unless a refresh moved its deadline.
        while (record := self.store._leases.get(lease_id)) is not None:
            with anyio.move_on_after(record.deadline - anyio.current_time()):
                await record.refreshed.wait()
                continue
            if anyio.current_time() >= record.deadline:
                self.store.expire_lease(lease_id)

    # -- waiter entries -------------------------------------------------------------------

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
        self._check_write(prefix + waiter_id, value, "register")
        await self._enter()
        key = prefix + waiter_id
        entry = self.store._kv.get(key)
        if entry is None:
            entry = self.store._put(key, value, lease.id if lease else 0)
        position = self.store._position(entry, prefix, ahead, kind)
        await checkpoint()
        return position

    async def position(
        self, entry: Entry, *, ahead: int | None = 1, kind: str | None = None
    ) -> Position:
        await self._enter(entry.key)
        current = self.store._kv.get(entry.key)
        if current is None or current.revision != entry.revision:
            raise EntryGoneError(f"{entry.key} no longer exists")
        prefix = entry.key[: entry.key.rindex("/") + 1]
        position = self.store._position(current, prefix, ahead, kind)
        await checkpoint()
        return position

    async def wait_deleted(
        self, keys: Sequence[str], *, revision: int, entry: Entry | None = None
    ) -> Position | None:
        await self._enter(*keys)
        if any(key not in self.store._kv for key in keys):
            await checkpoint()
            return None
        event = anyio.Event()
        for key in keys:
            self.store._deleted.setdefault(key, []).append(event.set)
        try:
            await event.wait()
        finally:
            for key in keys:
                _forget(self.store._deleted, key, event.set)
        return None  # the caller reads its position: this store proves nothing

    def guard(
        self, key: str, *, revision: int, on_change: Callable[[], None]
    ) -> Callable[[], None]:
        check_key(key, "memory store")
        assert self._tg is not None, "the backend is not open"
        armed = [on_change]

        def fire() -> None:
            if armed:
                armed.pop()()

        current = self.store._kv.get(key)
        if current is None or current.revision > revision:
            # Gone already: say so soon, not now, unless stopped before then.
            self._tg.start_soon(_call, fire)
            return armed.clear

        def stop() -> None:
            armed.clear()
            _forget(self.store._deleted, key, fire)

        self.store._deleted.setdefault(key, []).append(fire)
        return stop

    async def wait_changed(self, entry: Entry, *, revision: int) -> None:
        await self._enter(entry.key)
        current = self.store._kv.get(entry.key)
        if current is None or (current.revision, current.version) != (
            entry.revision,
            entry.version,
        ):
            await checkpoint()
            return
        event = anyio.Event()
        self.store._changed.setdefault(entry.key, []).append(event)
        try:
            await event.wait()
        finally:
            waiters = self.store._changed.get(entry.key, [])
            if event in waiters:
                waiters.remove(event)

    async def delete(self, entry: Entry) -> bool:
        await self._enter(entry.key)
        current = self.store._kv.get(entry.key)
        same = current is not None and (
            current.revision == entry.revision
            if not entry.provisional
            else current.lease == entry.lease
        )
        deleted = same and self.store._delete_key(entry.key)
        await checkpoint()
        return deleted

    # -- plain keys -----------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        await self._enter(key)
        entry = self.store._kv.get(key)
        await checkpoint()
        return entry

    async def find(self, prefix: str, waiter_id: str, lease: Lease | None) -> Entry | None:
        entry = await self.get(prefix + waiter_id)
        bound = lease.id if lease is not None else 0
        return entry if entry is not None and entry.lease == bound else None

    def _lease_of(self, key: str, lease: Lease | None) -> int:
        # An existing key keeps its lease; *lease* binds only a key being created.
        old = self.store._kv.get(key)
        return old.lease if old is not None else (lease.id if lease else 0)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> Entry:
        _keys.check_plain_key(key, "put")
        self._check_write(key, value, "put")
        await self._enter()
        entry = self.store._put(key, value, self._lease_of(key, lease))
        await checkpoint()
        return entry

    async def compare_and_set(
        self, key: str, value: bytes, *, version: int | None, lease: Lease | None = None
    ) -> Entry | None:
        if version is None:
            _keys.check_plain_key(key, "compare_and_set")
        self._check_write(key, value, "compare_and_set")
        await self._enter()
        current = self.store._kv.get(key)
        ok = (
            current is None
            if version is None
            else (current is not None and current.version == version)
        )
        entry = self.store._put(key, value, self._lease_of(key, lease)) if ok else None
        await checkpoint()
        return entry

    async def transact(self, ops: Sequence[Op]) -> tuple[Entry | None, ...] | None:
        written = check_ops(ops, self.max_value_size)
        check_request(estimate(written), self.max_request_size, "transact")
        await self._enter()
        store = self.store
        for op in ops:
            if isinstance(op, Create):
                if op.lease is not None and op.lease.id not in store._leases:
                    raise SessionExpiredError(f"lease {op.lease.id:x} not found")
                if op.prefix + op.waiter_id in store._kv:  # as etcd: the key must be new
                    await checkpoint()
                    return None
                continue
            if isinstance(op, Put):
                continue
            current = store._kv.get(op.entry.key)
            if current is None or (current.revision, current.version) != (
                op.entry.revision,
                current.version if isinstance(op, Check) else op.entry.version,
            ):
                await checkpoint()
                return None
        results = store._apply(ops)
        await checkpoint()
        return results

    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        await self._enter(prefix)
        queue = self.store._queue(prefix)
        listing = Listing(tuple(queue[:limit] if limit is not None else queue), self.store.revision)
        await checkpoint()
        return listing

    async def names(self, prefix: str = "") -> list[str]:
        await self._enter(prefix)
        names = _keys.names_of(self.store._kv, prefix)
        await checkpoint()
        return names

    @asynccontextmanager
    async def watch(self, prefix: str, *, revision: int) -> AsyncIterator[AsyncIterator[Change]]:
        await self._enter(prefix)
        store = self.store
        send, receive = anyio.create_memory_object_stream[Change](20_000)
        changes = _WaiterChanges(receive, prefix, lost=revision < store.compacted)
        for change in store._history:
            if change.revision > revision and change.entry.key.startswith(prefix):
                send.send_nowait(change)
        item = (prefix, send)
        store._watchers.append(item)
        try:
            async with receive:
                yield changes
        finally:
            store._watchers.remove(item)
            send.close()


class _WaiterChanges:
    """Creations and deletions of the waiter entries of *prefix*; ResyncNeeded when the
    history asked for is gone or the watcher fell behind (the store closed its stream)."""

    def __init__(self, receive: AsyncIterator[Change], prefix: str, *, lost: bool) -> None:
        self._receive = receive
        self._prefix = prefix
        self._lost = lost

    def __aiter__(self) -> _WaiterChanges:
        return self

    async def __anext__(self) -> Change:
        while True:
            if self._lost:
                raise ResyncNeeded("memory://: the changes asked for are no longer kept")
            try:
                change = await self._receive.__anext__()
            except StopAsyncIteration:
                self._lost = True  # dropped for not keeping up
                continue
            entry = change.entry
            if not _keys.is_waiter(entry.key, self._prefix):
                continue
            if change.kind is ChangeKind.PUT and entry.revision != change.revision:
                continue  # a value change, not a creation
            return change


def _forget(table: dict[str, list[Callable[[], None]]], key: str, wake: Callable[[], None]) -> None:
    wakes = table.get(key)
    if wakes is not None and wake in wakes:
        wakes.remove(wake)
        if not wakes:
            del table[key]


async def _call(func: Callable[[], None]) -> None:
    func()
