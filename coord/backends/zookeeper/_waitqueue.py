"""Waiter queues on ZooKeeper: Curator's lock internals behind coord's contract.

A waiter is an EPHEMERAL_SEQUENTIAL node ``<parent>/<waiter id>-<sequence>`` (parents
are containers); register creates it and lists the children in one pipelined round
trip, a lost create is adopted only if its ephemeralOwner is this session (CURATOR-498),
a wait is a data watch on exactly the nodes asked for, and a delete is by path. A long
queue moves its waiters' nodes into shards of ``SHARD`` sequence numbers
(``_paths.py``), so that a listing never reads every waiter. The whole design, and why,
is told in ``docs/design/zookeeper-wait-queue.md``.
"""

from __future__ import annotations

import asyncio
import logging
from operator import methodcaller
from typing import TYPE_CHECKING, Any

import anyio
from kazoo import exceptions as kz

from ..._core.exceptions import (
    BackendError,
    BackendUnavailable,
    EntryGoneError,
    SessionExpiredError,
)
from ...abc import Entry, Listing, Position
from ._cache import EntryCache
from ._errors import ANSWERS
from ._paths import (
    SHARD,
    fence_of_name,
    is_sharded,
    nearest_before,
    parse_waiter,
    sequence_of,
    shard_dir,
    shard_dirs,
    shard_index,
    sharded_name,
    waiter_names,
    waiters_before,
    waiters_in_order,
)
from ._wire import MultiFailed, create_op, delete_op

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Generator, Sequence

    from ._connection import Connection
    from ._nodes import Nodes
    from ._paths import Paths
    from ._watches import WatchRegistry
    from ._wire import WireClient

__all__ = ["WaitQueues", "committing", "entry_of"]

log = logging.getLogger("coord.backends.zookeeper")

# Listings a limited read makes when the entries it listed keep going before they are
# read (a queue churning faster than two round trips).
_RELISTS = 10
# Reads pipelined at once (a listing of a long queue reads its entries in batches).
_READS = 256
# Creates whose reply was lost and whose node was not found: try again this many times.
_CREATE_ATTEMPTS = 3
# Deletes of one node refused because it was written meanwhile: read it and try again this
# many times (then a BackendError: the session's delete retries with backoff).
_DELETE_ATTEMPTS = 5
#: A waiter registered with this many waiter nodes ahead of it in the queue's own node
#: is moved into its shard (see the module's docstring).
SHARD_AFTER = 256


def _earlier_twin(children: list[str], waiter_id: str, name: str) -> bool:
    """Whether *children* hold a node of *waiter_id* created before *name* (the same
    registration, repeated after a lost reply)."""
    mine = sequence_of(name) or 0
    mark = waiter_id + "-"
    return any(c.startswith(mark) and (sequence_of(c) or mine) < mine for c in children)


def entry_of(key: str, data: bytes | None, stat: Any) -> Entry:
    """The contract's Entry for a znode: revision = czxid (the fencing token), or for a
    node moved into a shard, the czxid of the node it was moved from (in its name)."""
    revision = fence_of_name(key.rpartition("/")[2]) or stat.czxid
    return Entry(key, data or b"", revision, stat.version, stat.ephemeralOwner)


class WaitQueues:
    """The waiter-queue operations of one backend."""

    def __init__(
        self, conn: Connection, nodes: Nodes, paths: Paths, watches: WatchRegistry
    ) -> None:
        self._conn = conn
        self._nodes = nodes
        self._paths = paths
        self._watches = watches
        self._cache = EntryCache(watches)  # the heads of queues read with stale_ok
        # prefix + waiter id of the registrations that did not answer (see register)
        self._unanswered: set[str] = set()
        # The queue nodes whose last listing here had shards: a wake-up there lists the
        # node and the waiter's shard together (one round trip), as a long queue needs.
        self._sharded: set[str] = set()

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

    async def has_waiters(self, node: str, children: list[str]) -> bool:
        """Whether the queue whose node is *node* (with *children*) has a waiter node:
        among its children, or in a shard (an empty shard lingers until the server
        reaps it)."""
        if any(parse_waiter(child) is not None for child in children):
            return True
        shards = [f"{node}/{d}" for d in shard_dirs(children)]
        return bool(shards) and any(
            listed and listed[0] for listed in await self._list_many(shards)
        )

    async def read(
        self, prefix: str, names: Sequence[str], *, watch: bool = False, cached: bool = False
    ) -> list[Entry | None]:
        """The entries ``prefix + name`` (None for those that no longer exist); with
        *watch*, each read also arms a data watch on its node (:meth:`guard` then needs
        no read of its own). With *cached*, an entry kept by the cache is not read, and
        each read arms a data watch and is kept (``_cache.py``).

        The reads are pipelined (one round trip per :data:`_READS` of them: each batch
        has the session timeout to answer), without a task per read, so that a failure
        is one translated error, not an exception group.
        """
        if len(names) > _READS:
            results: list[Entry | None] = []
            for i in range(0, len(names), _READS):
                batch = names[i : i + _READS]
                results += await self.read(prefix, batch, watch=watch, cached=cached)
            return results
        if not names:
            return []
        paths = [self._paths.path(prefix + name) for name in names]
        cache = self._cache if cached else None
        kept = [cache.get(path) for path in paths] if cache is not None else [None] * len(paths)
        # Listening before the reads are sent (CURATOR-527): see _cache.py.
        tokens = [
            cache.arm(path) if cache is not None and entry is None else None
            for path, entry in zip(paths, kept, strict=True)
        ]
        results = []
        with anyio.move_on_after(self._conn.timeout) as budget:
            client = await self._conn.ready(self._conn.timeout)
            watcher = self._watches.data_watcher if watch or cached else None
            replies = [
                client.get_data_nowait(path, watcher) if entry is None else None
                for path, entry in zip(paths, kept, strict=True)
            ]
            for name, path, reply, entry, token in zip(
                names, paths, replies, kept, tokens, strict=True
            ):
                if reply is None:  # kept: unchanged since read (see _cache.py)
                    results.append(entry)
                    continue
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
                    token = None  # read without a watch: not kept
                read = entry_of(prefix + name, data, stat)
                if token is not None and cache is not None:
                    cache.keep(path, read, token)
                results.append(read)
        if budget.cancelled_caught:
            raise BackendUnavailable(f"ZooKeeper get under {prefix!r}: no answer")
        return results

    async def _read_one(self, path: str) -> tuple[bytes, Any] | None:
        try:
            return await self._conn.call("get", lambda c: c.get_data(path), retry=True)  # type: ignore[no-any-return]
        except kz.NoNodeError:
            return None

    async def entries(self, prefix: str, limit: int | None, *, cached: bool = False) -> Listing:
        """The waiter entries of *prefix*, oldest first; revision: the newest pzxid of the
        parent and its shards (the last change to the queue's children).

        The listing and the reads are two round trips: an entry deleted in between is
        skipped and the next one read, and if every listed one went, the children are
        listed again; so that "the first n" means the first n that exist (as one atomic
        read gives on etcd), never fewer while more exist.

        *cached* (with a *limit*): the entries are read with data watches and kept
        (``_cache.py``), and those kept since the last such listing of *prefix* and
        unchanged are not read again.
        """
        entries: list[Entry] = []
        pzxid = 0
        node = self._paths.parent(prefix)
        for _ in range(_RELISTS):
            listing = await self.children(node)
            if listing is None:
                return Listing((), 0)
            pzxid = listing[1]
            children = listing[0]
            shards = shard_dirs(children)
            if shards:  # listed after the node: a node moved in between is in one of them
                for listed in await self._list_many([f"{node}/{d}" for d in shards]):
                    children = children + (listed[0] if listed else [])
                    # A change inside a shard moves the shard's pzxid, not the node's:
                    # the revision is the newest of them (what a watch compares with).
                    pzxid = max(pzxid, listed[1] if listed else 0)
            names = waiters_in_order(children)
            if limit is None:
                return Listing(tuple(await self._existing(prefix, node, names)), pzxid)
            entries = []
            missing = False
            while names and len(entries) < limit:
                wanted, names = names[: limit - len(entries)], names[limit - len(entries) :]
                found = await self._existing(prefix, node, wanted, cached=cached)
                missing = missing or len(found) < len(wanted)
                entries += found
            if len(entries) >= limit or not missing:
                break
        if cached:
            self._cache.retain(node, (self._paths.path(e.key) for e in entries))
        return Listing(tuple(entries), pzxid)

    async def existing(self, prefix: str, names: Sequence[str]) -> list[Entry]:
        """The entries ``prefix + name`` that still exist, in the order of *names*."""
        return [e for e in await self.read(prefix, names) if e is not None]

    async def _existing(
        self, prefix: str, node: str, names: Sequence[str], *, cached: bool = False
    ) -> list[Entry]:
        """:meth:`existing`, where a waiter node listed in the queue's node and gone when
        read is looked for in its shard (listed after the read): it may have moved
        there in between, as one transaction."""
        read = await self.read(prefix, names, cached=cached)
        missing = [n for n, e in zip(names, read, strict=True) if e is None and not is_sharded(n)]
        moved: dict[str, str] = {}
        if missing:
            dirs = sorted({shard_dir(sequence_of(n) or 0) for n in missing})
            by_sequence = {
                sequence_of(child): child
                for listed in await self._list_many([f"{node}/{d}" for d in dirs])
                if listed is not None
                for child in listed[0]
            }
            moved = {n: m for n in missing if (m := by_sequence.get(sequence_of(n)))}
        if moved:
            found = dict(zip(moved, await self.read(prefix, list(moved.values())), strict=True))
            read = [found.get(n) if e is None else e for n, e in zip(names, read, strict=True)]
        return [e for e in read if e is not None]

    async def place(
        self,
        mine: Entry,
        children: list[str],
        pzxid: int,
        ahead: int | None,
        known: dict[str, Entry | None] | None = None,
        kind: str | None = None,
        *,
        watch: bool = False,
    ) -> Position | None:
        """My position in a listing; None if an entry ahead left meanwhile (list again).

        :param known: entries already read, by name (read again if missing)
        :param watch: arm a data watch on each entry read (see :meth:`read`)
        :raises EntryGoneError: if my node is not among *children*
        """
        prefix, _, name = self._paths.split(mine.key)
        wanted = nearest_before(children, name, ahead, kind)
        if wanted is None:
            raise EntryGoneError(f"{mine.key} no longer exists")
        known = known or {}
        unknown = [n for n in wanted if n not in known]
        read = dict(zip(unknown, await self.read(prefix, unknown, watch=watch), strict=True))
        entries = [known[n] if n in known else read[n] for n in wanted]
        if any(entry is None for entry in entries):
            return None
        return Position(mine, tuple(e for e in entries if e is not None), pzxid)

    async def position(self, entry: Entry, ahead: int | None, kind: str | None) -> Position:
        while True:
            position = await self._locate(entry, ahead, kind)
            if position is not None:
                return position

    async def _locate(
        self,
        mine: Entry,
        ahead: int | None,
        kind: str | None,
        listing: tuple[list[str], int] | None = None,
    ) -> Position | None:
        """My position among the waiter nodes of the queue's node and of its shards;
        None if an entry ahead left meanwhile (locate again).

        The queue's node is listed first, then my shard (pipelined: one round trip; a
        node of mine that is not in a shard, in a queue whose last listing had no
        shards, lists it only if the node's listing shows it: a short queue has none,
        and a wake-up then costs one request), then, only as far as needed, the shards
        below mine, highest first. Entries
        ahead are never created after mine (sequence numbers only grow), and one moved
        into a shard leaves the node and enters the shard in one transaction: so the
        listings, read in that order, miss none of them.

        :raises EntryGoneError: if my node is in none of them
        """
        prefix, node, name = self._paths.split(mine.key)
        sequence = sequence_of(name)
        if sequence is None:
            raise EntryGoneError(f"{mine.key} is not a waiter entry")
        listing, shard = await self._listings(node, name, sequence, listing)
        if listing is None or name not in (shard[0] if is_sharded(name) and shard else listing[0]):
            raise EntryGoneError(f"{mine.key} no longer exists")
        children, pzxid = listing
        shards = [i for i in map(shard_index, children) if i is not None]
        if shards:
            self._sharded.add(node)
        else:
            self._sharded.discard(node)
        before = waiters_before(children, sequence, kind)
        if shard is not None:
            before += waiters_before(shard[0], sequence, kind)
        before += await self._lower(node, shards, sequence, kind, ahead, before)
        entries = await self.read(prefix, _nearest(before, ahead))
        if any(entry is None for entry in entries):
            return None
        return Position(mine, tuple(e for e in entries if e is not None), pzxid)

    async def _listings(
        self, node: str, name: str, sequence: int, listing: tuple[list[str], int] | None
    ) -> tuple[tuple[list[str], int] | None, tuple[list[str], int] | None]:
        """The listing of the queue's *node* (*listing*, if it was read already) and of
        the shard of my node *name* (None if it is in none): one round trip when my node
        is in a shard or the queue has some, else the shard only if the node shows it."""
        mine_dir = shard_dir(sequence)
        if listing is None and (is_sharded(name) or node in self._sharded):
            listing, shard = await self._list_many([node, f"{node}/{mine_dir}"])
            return listing, shard
        if listing is None:
            listing = await self.children(node)
            if listing is not None and mine_dir in listing[0]:
                return listing, (await self._list_many([f"{node}/{mine_dir}"]))[0]
            return listing, None
        if is_sharded(name) or mine_dir in listing[0]:
            return listing, (await self._list_many([f"{node}/{mine_dir}"]))[0]
        return listing, None

    async def _lower(
        self,
        node: str,
        shards: list[int],
        sequence: int,
        kind: str | None,
        ahead: int | None,
        before: list[tuple[int, str]],
    ) -> list[tuple[int, str]]:
        """The waiters ahead of mine in the shards below mine, listed highest first only
        until the nearest *ahead* are known with *before* (all of them for None): a
        lower shard holds only numbers below (its block + 1) * SHARD."""
        found: list[tuple[int, str]] = []
        lower = sorted((i for i in shards if i < sequence // SHARD), reverse=True)
        while lower and (
            ahead is None or sum(s >= (lower[0] + 1) * SHARD for s, _ in [*before, *found]) < ahead
        ):
            batch, lower = (lower, []) if ahead is None else (lower[:1], lower[1:])
            listed = await self._list_many([f"{node}/{shard_dir(i * SHARD)}" for i in batch])
            for listing in listed:
                if listing is not None:
                    found += waiters_before(listing[0], sequence, kind)
        return found

    async def _list_many(self, paths: Sequence[str]) -> list[tuple[list[str], int] | None]:
        """The children and pzxid of each of *paths* (None: no such node), listed in that
        order, pipelined: one round trip."""
        results: list[tuple[list[str], int] | None] = []
        with anyio.move_on_after(self._conn.timeout) as budget:
            client = await self._conn.ready(self._conn.timeout)
            replies = [client.get_children_nowait(path) for path in paths]
            for reply in replies:
                try:
                    children, stat = await reply.wait()
                except kz.NoNodeError:
                    results.append(None)
                    continue
                except Exception:  # a connection loss...: listed again, in order
                    return [await self.children(p) for p in paths]
                results.append((list(children), int(stat.pzxid)))
        if budget.cancelled_caught:
            raise BackendUnavailable(f"ZooKeeper list under {paths[0]!r}: no answer")
        return results

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
        ident = prefix + waiter_id
        try:
            return await self._register(node, prefix, waiter_id, session_id, value, ahead, kind)
        except BaseException:
            # Its node may exist (and may have moved into a shard, where the listing a
            # repeat makes does not look): a repeat, or the delete of the provisional
            # entry, looks for it everywhere.
            self._unanswered.add(ident)
            raise

    async def _register(
        self,
        node: str,
        prefix: str,
        waiter_id: str,
        session_id: int,
        value: bytes,
        ahead: int | None,
        kind: str | None,
    ) -> Position:
        ident = prefix + waiter_id
        if ident in self._unanswered:
            found = await self.find(node, waiter_id, session_id)
            self._unanswered.discard(ident)
            if found is not None and is_sharded(found[0]):  # moved: no twin to make
                mine = entry_of(prefix + found[0], value, found[1])
                return await self.position(mine, ahead, kind)
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
                    log.info("adopted %s/%s, an earlier node of %s", node, found[0], name)
                    await self.delete_path(f"{node}/{name}")
                    name, stat = found
                    mine = entry_of(prefix + name, value, stat)
                    listing = None
                    continue
            long = _tickets_before(listing[0], sequence_of(name)) >= SHARD_AFTER
            if session_id and long and not is_sharded(name):
                name = await self._move(node, name, stat, value)
                mine = entry_of(prefix + name, value, stat)
                listing = None
            if listing is not None and not any(shard_index(c) is not None for c in listing[0]):
                # The one entry an exclusive waiter waits for is read with its watch
                # armed: the wait that follows sends nothing (5 requests a contended
                # acquisition instead of 6).
                exclusive = ahead == 1 and kind is None and session_id != 0
                position = await self.place(mine, *listing, ahead, known, kind, watch=exclusive)
            else:  # shards: entries ahead may be in them
                position = await self._locate(mine, ahead, kind, listing)
            if position is not None:
                return position
            listing, known = None, {}  # an entry ahead left meanwhile: list again

    async def _move(self, node: str, name: str, stat: Any, value: bytes) -> str:
        """Move my waiter node *name* (of *stat*) into its shard: delete it and create
        it there, in one transaction; return its new name. A long queue's node keeps
        about :data:`SHARD_AFTER` waiter nodes, so no listing of it costs more; the new
        name keeps the sequence number (the place in the queue) and the czxid (the
        fence: later waiters' nodes were created after it, and moved later or not).

        :raises EntryGoneError: if my node is gone (its session expired)
        """
        new = sharded_name(name, stat.czxid)
        sequence = sequence_of(name) or 0
        source, target = f"{node}/{name}", f"{node}/{shard_dir(sequence)}/{new}"
        ops = [delete_op(source, -1), create_op(target, value, self._conn.acl, ephemeral=True)]
        for _ in range(_CREATE_ATTEMPTS):
            try:
                results = await self._conn.call("move", committing(ops))  # not repeated
            except BackendUnavailable:
                # No answer: a transaction happened entirely or not at all.
                if await self._conn.call("exists", methodcaller("exists", target), retry=True):
                    return new
                if await self._conn.call("exists", methodcaller("exists", source), retry=True):
                    continue
                raise EntryGoneError(f"{source} vanished while it moved") from None
            failed = [r for r in results if isinstance(r, Exception)]
            real = [r for r in failed if not isinstance(r, kz.RolledBackError)]
            if not failed:
                return new
            if isinstance(results[0], kz.NoNodeError):
                raise EntryGoneError(f"{source} vanished while it moved")
            if isinstance(results[1], kz.NoNodeError):  # its shard: created on demand
                await self._nodes.ensure_parents(target)
                continue
            error = real[0] if real else failed[0]
            raise BackendError(f"ZooKeeper move of {source}: {type(error).__name__} {error}")
        raise BackendUnavailable(f"ZooKeeper move of {source}: no answer")

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
                    log.info("adopted %s/%s after a lost create reply", node, found[0])
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
        children = listing[0]
        shards = shard_dirs(children)
        if shards:  # a recovery call: every shard is listed
            for listed in await self._list_many([f"{node}/{d}" for d in shards]):
                children = children + (listed[0] if listed else [])
        for waiter in waiter_names(children):
            if waiter.waiter_id != waiter_id:
                continue
            path = self._paths.child(node, waiter.name)
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
        # A waiter node's watch armed by an earlier read is this guard's own: its name is
        # never used again, so the node it watches is the one the caller read.
        unique = parse_waiter(key.rpartition("/")[2]) is not None
        guard = _Guard(self._watches, self._paths.path(key), on_change, unique)
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
            if (entry_of(entry.key, None, stat).revision, stat.version) != (
                entry.revision,
                entry.version,
            ):
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
        prefix, node, name = self._paths.split(entry.key)
        if entry.provisional:  # registration outcome unknown: look for its GUID
            self._unanswered.discard(entry.key)
            deleted = False
            while found := await self.find(node, name, entry.lease):
                deleted = await self.delete_path(self._paths.path(prefix + found[0])) or deleted
        elif parse_waiter(name) is not None:
            deleted = await self.delete_path(self._paths.path(entry.key))
        else:
            deleted = await self._delete_same(self._paths.path(entry.key), entry.revision)
        if deleted and not self._nodes.containers:
            await self._nodes.prune(self._paths.path(entry.key))
        return deleted

    async def _delete_same(self, path: str, czxid: int) -> bool:
        # A plain key can be deleted and created again under the same name: compare the
        # creation zxid, then delete only that version. A write in between (a Curator
        # Revoker's "__REVOKE__" in a peer layout's node: locks/Revoker.java) leaves the
        # same node with a newer version: read it again, never report it gone. A delete
        # whose reply was lost is not sent again blindly (the name may be someone
        # else's by then): the read tells, and the node gone after that attempt may
        # be its doing (True, as delete_path and etcd say after a repeat).
        unknown = False
        for _ in range(_DELETE_ATTEMPTS):
            stat = await self._conn.call("exists", lambda c: c.exists(path), retry=True)
            if stat is None or stat.czxid != czxid:
                return unknown
            try:
                await self._conn.call("delete", methodcaller("delete", path, stat.version))
            except kz.NoNodeError:
                return unknown  # (a lagging member's read may predate that attempt)
            except kz.BadVersionError:
                continue
            except BackendUnavailable:
                unknown = True
                continue
            return True
        raise BackendError(f"ZooKeeper delete {path}: its data keeps changing")


def _tickets_before(children: list[str], sequence: int | None) -> int:
    """How many waiter nodes of the queue's own node are before *sequence*."""
    return 0 if sequence is None else len(waiters_before(children, sequence))


def committing(ops: list[Any]) -> Callable[[WireClient], Awaitable[list[Any]]]:
    """The multi request of *ops*: its results, or, if it failed as a whole, one
    exception per operation (the one that failed and the rolled back ones)."""

    async def commit(client: WireClient) -> list[Any]:
        try:
            return await client.multi(ops)
        except MultiFailed as failed:
            return failed.results

    return commit


class _Guard:
    """One guarded node: a listener in the watch table and the callback to make once,
    as one small object (a held lock or a waiter keeps one for as long as it lives)."""

    __slots__ = ("_listener", "_on_change", "_path", "_unique", "_watches")

    def __init__(
        self, watches: WatchRegistry, path: str, on_change: Callable[[], None], unique: bool
    ) -> None:
        self._watches = watches
        self._path = path
        self._unique = unique  # a waiter node: a watch armed on the path is on this node
        self._on_change: Callable[[], None] | None = on_change
        self._listener = self.fire  # one bound method: added, then discarded, by identity

    def arm(self, client: WireClient | None) -> None:
        self._watches.add("data", self._path, self._listener)  # listen first (CURATOR-527)
        watcher = self._watches.data_watcher
        try:
            if client is None:
                raise kz.ConnectionLoss()
            if self._unique and client.data_watched(self._path, watcher):
                return  # armed by the read that found the node (it fires when it goes)
            reply = client.get_data_nowait(self._path, watch=watcher)
        except kz.KazooException:
            self.fire()  # not connected: the re-read waits for a connection
        else:
            reply.on_resolved = self._read

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


def _nearest(before: list[tuple[int, str]], ahead: int | None) -> list[str]:
    """The names of the *ahead* nearest waiters of *before* (all for None), nearest
    first; a node moved into a shard meanwhile may be listed twice: once."""
    nearest: dict[int, str] = {}
    for sequence, child in sorted(before, reverse=True):
        nearest.setdefault(sequence, child)
    names = list(nearest.values())
    return names[:ahead] if ahead is not None else names
