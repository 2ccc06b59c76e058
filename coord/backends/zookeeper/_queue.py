"""Waiter queues on ZooKeeper: Curator's lock internals behind coord's contract.

* register — in one round trip (pipelined: ZooKeeper runs a session's requests in
  order), create ``<parent>/<waiter id>-`` EPHEMERAL_SEQUENTIAL (parents as containers)
  and list the children; sorted by sequence, the nearest children before mine are ahead
  of me, and only those are read (a second round trip, only when someone is ahead).
  If the create's reply is lost, the children are searched for my GUID, and a node found
  is adopted only if its ephemeralOwner is my session (CURATOR-498).
* position — list the children again: my node missing means my entry is gone.
* wait — a data watch (``getData``, never ``exists``: on a deleted path that leaves a
  creation watch behind) on exactly the keys asked for; "no node" returns at once.
* delete — by path: a waiter's name carries a one-time GUID, so the node at that path can
  only be that entry. A provisional entry is found by its GUID and deleted only if it
  belongs to the given session.

Every listing is answered with the parent's pzxid, the zxid of the last change to its
children: that is the revision of a :class:`~coord.abc.Position` or
:class:`~coord.abc.Listing`.
"""

from __future__ import annotations

import asyncio
import logging
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._exceptions import BackendUnavailable, EntryGoneError, SessionExpiredError
from ...abc import Entry, Listing, Position
from ._errors import ANSWERS
from ._paths import nearest_before, parse_waiter, sequence_of, waiter_names

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths
    from ._watches import WatchRegistry
    from ._wire import WireClient

__all__ = ["Queues", "entry_of"]

log = logging.getLogger("coord.backends.zookeeper")

# Listings a limited read makes when the entries it listed keep going before they are
# read (a queue churning faster than two round trips).
_RELISTS = 10
# Creates whose reply was lost and whose node was not found: try again this many times.
_CREATE_ATTEMPTS = 3


def _earlier_twin(children: list[str], waiter_id: str, name: str) -> bool:
    """Whether *children* hold a node of *waiter_id* created before *name* (the same
    registration, repeated after a lost reply)."""
    mine = sequence_of(name) or 0
    mark = waiter_id + "-"
    return any(c.startswith(mark) and (sequence_of(c) or mine) < mine for c in children)


def entry_of(key: str, data: bytes | None, stat: Any) -> Entry:
    """The contract's Entry for a znode: revision = czxid (the fencing token)."""
    return Entry(key, data or b"", stat.czxid, stat.version, stat.ephemeralOwner)


class Queues:
    """The waiter-queue operations of one backend."""

    def __init__(
        self, conn: Connection, nodes: Nodes, paths: Paths, watches: WatchRegistry
    ) -> None:
        self._conn = conn
        self._nodes = nodes
        self._paths = paths
        self._watches = watches

    # -- reading --------------------------------------------------------------------------

    async def children(self, node: str) -> tuple[list[str], int] | None:
        """The children of *node* and its pzxid, or None if it does not exist."""
        try:
            children, stat = await self._conn.call(
                "list", lambda c: c.get_children(node, include_data=True), retry=True
            )
        except kz.NoNodeError:
            return None
        return list(children), int(stat.pzxid)

    async def read(self, prefix: str, names: Sequence[str]) -> list[Entry | None]:
        """The entries ``prefix + name`` (None for those that no longer exist).

        The reads are pipelined (one round trip), without a task per read, so that a
        failure is one translated error, not an exception group.
        """
        if not names:
            return []
        paths = [self._paths.path(prefix + name) for name in names]
        results: list[Entry | None] = []
        with anyio.move_on_after(self._conn.timeout) as budget:
            client = await self._conn.ready(self._conn.timeout)
            replies = [client.get_data_nowait(path) for path in paths]
            for name, path, reply in zip(names, paths, replies, strict=True):
                try:
                    data, stat = await reply.wait()
                except kz.NoNodeError:
                    results.append(None)
                    continue
                except Exception:  # a connection loss...: this one read is retried
                    data, stat = await self._read_one(path) or (None, None)
                    if stat is None:
                        results.append(None)
                        continue
                results.append(entry_of(prefix + name, data, stat))
        if budget.cancelled_caught:
            raise BackendUnavailable(f"ZooKeeper get under {prefix!r}: no answer")
        return results

    async def _read_one(self, path: str) -> tuple[bytes, Any] | None:
        try:
            return await self._conn.call("get", lambda c: c.get_data(path), retry=True)  # type: ignore[no-any-return]
        except kz.NoNodeError:
            return None

    async def entries(self, prefix: str, limit: int | None) -> Listing:
        """The waiter entries of *prefix*, oldest first; revision: the parent's pzxid.

        The listing and the reads are two round trips: an entry deleted in between is
        skipped and the next one read, and if every listed one went, the children are
        listed again; so that "the first n" means the first n that exist (as one atomic
        read gives on etcd), never fewer while more exist.
        """
        entries: list[Entry] = []
        pzxid = 0
        for _ in range(_RELISTS):
            listing = await self.children(self._paths.parent(prefix))
            if listing is None:
                return Listing((), 0)
            pzxid = listing[1]
            names = [w.name for w in waiter_names(listing[0])]
            if limit is None:
                return Listing(tuple(await self.existing(prefix, names)), listing[1])
            entries = []
            missing = False
            while names and len(entries) < limit:
                wanted, names = names[: limit - len(entries)], names[limit - len(entries) :]
                found = await self.existing(prefix, wanted)
                missing = missing or len(found) < len(wanted)
                entries += found
            if len(entries) >= limit or not missing:
                break
        return Listing(tuple(entries), pzxid)

    async def existing(self, prefix: str, names: Sequence[str]) -> list[Entry]:
        """The entries ``prefix + name`` that still exist, in the order of *names*."""
        return [e for e in await self.read(prefix, names) if e is not None]

    async def place(
        self,
        mine: Entry,
        children: list[str],
        pzxid: int,
        ahead: int | None,
        known: dict[str, Entry | None] | None = None,
        kind: str | None = None,
    ) -> Position | None:
        """My position in a listing; None if an entry ahead left meanwhile (list again).

        :param known: entries already read, by name (read again if missing)
        :raises EntryGoneError: if my node is not among *children*
        """
        prefix, _, name = self._paths.split(mine.key)
        wanted = nearest_before(children, name, ahead, kind)
        if wanted is None:
            raise EntryGoneError(f"{mine.key} no longer exists")
        known = known or {}
        unknown = [n for n in wanted if n not in known]
        read = dict(zip(unknown, await self.read(prefix, unknown), strict=True))
        entries = [known[n] if n in known else read[n] for n in wanted]
        if any(entry is None for entry in entries):
            return None
        return Position(mine, tuple(e for e in entries if e is not None), pzxid)

    async def position(self, entry: Entry, ahead: int | None, kind: str | None) -> Position:
        _, node, _ = self._paths.split(entry.key)
        while True:
            listing = await self.children(node)
            if listing is None:
                raise EntryGoneError(f"{entry.key} no longer exists")
            position = await self.place(entry, *listing, ahead, kind=kind)
            if position is not None:
                return position

    # -- registering ----------------------------------------------------------------------

    async def register(
        self,
        prefix: str,
        waiter_id: str,
        session_id: int,
        value: bytes,
        ahead: int | None,
        kind: str | None,
    ) -> Position:
        node = self._paths.parent(prefix)
        # The create and the listing, pipelined (one round trip); the entries ahead of
        # mine, if any, are read next. Missing parents are created on NoNode.
        name, stat, listing, known = await self._create(node, waiter_id, session_id, value, [])
        mine = entry_of(prefix + name, value, stat)
        while True:
            if listing is None:
                listing = await self.children(node)
                if listing is None:
                    raise EntryGoneError(f"{mine.key} vanished during registration")
            if _earlier_twin(listing[0], waiter_id, name):
                # Registered twice (a retry after a lost reply): keep the first node.
                found = await self.find(node, waiter_id, session_id)
                if found is not None and found[0] != name:
                    log.info("coord: adopted %s/%s, an earlier node of %s", node, found[0], name)
                    await self.delete_path(f"{node}/{name}")
                    name, stat = found
                    mine = entry_of(prefix + name, value, stat)
                    listing = None
                    continue
            position = await self.place(mine, *listing, ahead, known, kind)
            if position is not None:
                return position
            listing, known = None, {}  # an entry ahead left meanwhile: list again

    async def _create(
        self, node: str, waiter_id: str, session_id: int, value: bytes, reads: list[str]
    ) -> tuple[str, Any, tuple[list[str], int] | None, dict[str, Entry | None]]:
        paths = {self._paths.path(key): key for key in reads}
        for _ in range(_CREATE_ATTEMPTS):
            try:
                path, stat, listing, values = await self._nodes.create_and_list(
                    f"{node}/{waiter_id}-", value, node, list(paths), ephemeral=session_id != 0
                )
            except BackendUnavailable:
                # No reply: the node may or may not exist. Curator's protected mode.
                found = await self.find(node, waiter_id, session_id)
                if found is not None:
                    log.info("coord: adopted %s/%s after a lost create reply", node, found[0])
                    return found[0], found[1], None, {}
                continue
            if stat.ephemeralOwner != session_id:
                # Our expired session was replaced before we heard of it: this node
                # belongs to a session no lease stands for.
                await self.delete_path(path)
                raise SessionExpiredError(f"session {session_id:#x} expired while registering")
            known = {
                paths[p].rpartition("/")[2]: (entry_of(paths[p], *v) if v else None)
                for p, v in values.items()
            }
            return path.rpartition("/")[2], stat, listing, known
        raise BackendUnavailable(f"ZooKeeper create in {node}: no answer")

    async def find(self, node: str, waiter_id: str, session_id: int) -> tuple[str, Any] | None:
        """The oldest node of *waiter_id* owned by *session_id* (0: a durable node), as
        ``(name, stat)``."""
        listing = await self.children(node)
        if listing is None:
            return None
        for waiter in waiter_names(listing[0]):
            if waiter.waiter_id != waiter_id:
                continue
            path = f"{node}/{waiter.name}"
            stat = await self._conn.call("exists", methodcaller("exists", path), retry=True)
            if stat is not None and stat.ephemeralOwner == session_id:
                return waiter.name, stat
        return None

    # -- waiting and deleting -------------------------------------------------------------

    async def wait_deleted(self, keys: Sequence[str]) -> None:
        """Return once one of *keys* may be gone: a guard per key (:meth:`guard`: a data
        watch armed by a read sent now; "no node", a failed read or a disconnect fire it
        at once, and the caller re-reads) and one wake-up. No task, no event per key: a
        waiter's memory is mostly what it waits with."""
        woken = _Woken()
        stops = [self.guard(key, 0, woken.set) for key in keys]
        try:
            await woken
        finally:
            for stop in stops:
                stop()

    def guard(self, key: str, revision: int, on_change: Callable[[], None]) -> Callable[[], None]:
        """A data watch on *key*'s node, armed by a read sent now without waiting for it:
        *on_change* once the node is gone or written, or the connection dropped (every
        watch then fires). A waiter node's name is never used twice (its sequence suffix),
        so *revision* is not needed. No task; not a checkpoint."""
        guard = _Guard(self._watches, self._paths.path(key), on_change)
        guard.arm(self._conn.client)
        return guard.cancel

    async def wait_changed(self, entry: Entry, default_timeout: float) -> None:
        path = self._paths.path(entry.key)
        woken = anyio.Event()
        # A data watch fires on a write as well as on the deletion. The read that arms it
        # also tells whether the node already changed since the caller's read.
        with self._watches.listening("data", [path], woken.set):
            client = await self._conn.ready(default_timeout)
            reply = client.get_data_nowait(path, watch=self._watches.data_watcher)
            try:
                _, stat = await reply.wait()
            except kz.NoNodeError:
                return
            except ANSWERS as exc:
                raise self._conn.translate(exc, "watch", client) from exc
            except Exception as exc:
                error = self._conn.translate(exc, "watch", client)
                if isinstance(error, BackendUnavailable):
                    return  # a disconnect: the caller reads again, which waits for it
                raise error from exc
            if (stat.czxid, stat.version) != (entry.revision, entry.version):
                return
            await woken.wait()

    async def delete_path(self, path: str) -> bool:
        """Delete *path*; False only if it certainly did not exist. "No node" after the
        request was repeated (a reply lost with the connection) may mean that the first
        attempt deleted it: that is True."""
        try:
            await self._conn.call("delete", lambda c: c.delete(path), retry=True)
        except kz.NoNodeError as exc:
            return getattr(exc, "attempts", 1) > 1
        return True

    async def delete(self, entry: Entry) -> bool:
        _, node, name = self._paths.split(entry.key)
        if entry.provisional:  # registration outcome unknown: look for its GUID
            deleted = False
            while found := await self.find(node, name, entry.lease):
                deleted = await self.delete_path(f"{node}/{found[0]}") or deleted
        elif parse_waiter(name) is not None:
            deleted = await self.delete_path(f"{node}/{name}")
        else:
            deleted = await self._delete_same(self._paths.path(entry.key), entry.revision)
        if deleted and not self._nodes.containers:
            await self._nodes.prune(f"{node}/{name}")
        return deleted

    async def _delete_same(self, path: str, czxid: int) -> bool:
        # A plain key can be deleted and created again under the same name: compare the
        # creation zxid, then delete only that version.
        stat = await self._conn.call("exists", lambda c: c.exists(path), retry=True)
        if stat is None or stat.czxid != czxid:
            return False
        try:
            await self._conn.call("delete", lambda c: c.delete(path, stat.version))
        except (kz.NoNodeError, kz.BadVersionError):
            return False
        return True


class _Guard:
    """One guarded node: a listener in the watch table and the callback to make once,
    as one small object (a held lock or a waiter keeps one for as long as it lives)."""

    __slots__ = ("_listener", "_on_change", "_path", "_watches")

    def __init__(self, watches: WatchRegistry, path: str, on_change: Callable[[], None]) -> None:
        self._watches = watches
        self._path = path
        self._on_change: Callable[[], None] | None = on_change
        self._listener = self.fire  # one bound method: added, then discarded, by identity

    def arm(self, client: WireClient | None) -> None:
        self._watches.add("data", self._path, self._listener)  # listen first (CURATOR-527)
        try:
            if client is None:
                raise kz.ConnectionLoss()
            reply = client.get_data_nowait(self._path, watch=self._watches.data_watcher)
        except kz.KazooException:
            self.fire()  # not connected: the re-read waits for a connection
        else:
            reply.on_settled = self._read

    def fire(self) -> None:  # maybe in the wire client's reader: call back from a task
        self._watches.discard("data", self._path, self._listener)
        self._watches.call_in_task(self._call)

    def _call(self) -> None:  # a cancel() between fire() and this call wins
        on_change, self._on_change = self._on_change, None
        if on_change is not None:
            on_change()

    def _read(self, value: Any, error: BaseException | None) -> None:  # in the reader
        if error is not None:
            self.fire()  # gone already, or not armed (a disconnect): re-read

    def cancel(self) -> None:
        self._on_change = None
        self._watches.discard("data", self._path, self._listener)


class _Woken:
    """An awaitable that :meth:`set` (idempotent, not a checkpoint) makes return: on
    asyncio a bare future, a tenth of an ``anyio.Event``; on trio an Event."""

    __slots__ = ("_event", "_future")

    def __init__(self) -> None:
        try:
            self._future: asyncio.Future[None] | None = asyncio.get_running_loop().create_future()
            self._event: anyio.Event | None = None
        except RuntimeError:  # not asyncio: trio
            self._future, self._event = None, anyio.Event()

    def set(self) -> None:
        if self._event is not None:
            self._event.set()
        elif self._future is not None and not self._future.done():
            self._future.set_result(None)

    def __await__(self) -> Generator[Any, None, None]:
        if self._event is not None:
            return self._event.wait().__await__()
        assert self._future is not None
        return self._future.__await__()
