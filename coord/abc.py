"""The backend contract: what a coordination store must offer coord's recipes.

It is as small as etcd's ``concurrency`` package needs: a lease with keepalive and a loss
signal; ordered waiter entries bound to a lease (or durable, for queues); the nearest
entries ahead of mine; a wait for deletion; a guarded delete; get/put/compare-and-set; a
prefix watch; and one small all-or-nothing transaction over entries (etcd ``Txn``,
ZooKeeper ``multi``), which the queue's claims and fenced acks are made of; and, for tools
such as ``coord status``, a listing of the names in use. A store that speaks etcd's Go
layout (:attr:`Backend.layouts`) also lists keys by creation revision and waits for a
change under a prefix: all that etcd's ``concurrency`` package reads beyond the rest. A
store that speaks kazoo's or Curator's layout creates ephemeral sequential nodes named by
the caller and lists a node's raw children: all that those recipes need beyond the rest.
Recipes (mutex, election, ...) are written once against :class:`Backend` and never learn
which store runs under them. Keys are relative to the backend's namespace and use ``/``
as separator.

Every method here may raise :exc:`coord.BackendError` (or ``BackendUnavailable``) for a
store-side failure; none catches cancellation.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio.lowlevel
from anyio.abc import AsyncResource

from ._core.exceptions import ConfigurationError, EntryGoneError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from contextlib import AbstractAsyncContextManager

__all__ = [
    "Backend",
    "Change",
    "ChangeKind",
    "Check",
    "Children",
    "Create",
    "Entry",
    "EntryGoneError",
    "Lease",
    "Listing",
    "Op",
    "Position",
    "Put",
    "Remove",
    "Update",
]


@dataclass(frozen=True, slots=True)
class Entry:
    """One key of the store, as read at some revision.

    :ivar key: the key, relative to the namespace
    :ivar value: its value
    :ivar revision: creation order: strictly increasing over the whole store (the etcd
        create revision, the ZooKeeper czxid), or, for a waiter entry on etcd, along its
        queue (its order number, which one transaction gives each of the waiters it
        registers; see ``backends/etcd/_waitqueue.py``). This is the fencing token of a waiter
        entry.
    :ivar version: modification token for :meth:`Backend.compare_and_set`: the etcd mod
        revision, the ZooKeeper data version
    :ivar lease: id of the lease the key is bound to, 0 if none
    """

    key: str
    value: bytes = b""
    revision: int = 0
    version: int = 0
    lease: int = 0

    @property
    def provisional(self) -> bool:
        """True for an entry whose registration outcome is unknown (revision 0)."""
        return self.revision == 0


@dataclass(frozen=True, slots=True)
class Position:
    """Where a waiter entry stands in its queue.

    :ivar entry: my entry
    :ivar ahead: the nearest entries registered before mine, nearest first (at most the
        ``ahead`` limit asked for); empty when mine is at the head
    :ivar revision: the store revision at which this view was read; pass it to
        :meth:`Backend.wait_deleted` so that no deletion after the read is missed
    """

    entry: Entry
    ahead: tuple[Entry, ...] = ()
    revision: int = 0

    @property
    def is_head(self) -> bool:
        return not self.ahead


@dataclass(frozen=True, slots=True)
class Listing:
    """Entries read at one store revision."""

    entries: tuple[Entry, ...]
    revision: int = 0


@dataclass(frozen=True, slots=True)
class Children:
    """The raw names of a node's children, unsorted, read at one store revision (on
    ZooKeeper the parent's pzxid: it moves with every child created or deleted)."""

    names: tuple[str, ...]
    revision: int = 0


class ChangeKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Change:
    """One change seen by :meth:`Backend.watch`. ``entry.revision`` is 0 for deletes."""

    kind: ChangeKind
    entry: Entry
    revision: int = field(default=0)


@dataclass(frozen=True)
class Create:
    """A transaction step: create the entry ``prefix + waiter_id[+ suffix]``, as
    :meth:`Backend.register` does (ordered after every entry created before it), bound
    to *lease*, or durable (kept until deleted) when *lease* is None. *waiter_id* must be
    new (a fresh ``@``-id): a transaction is never repeated, so it cannot meet itself. (An
    existing key fails the transaction on etcd and memory; on ZooKeeper the sequence
    suffix makes every created name new: callers never reuse an id.)"""

    prefix: str
    waiter_id: str
    value: bytes = b""
    lease: Lease | None = None


@dataclass(frozen=True)
class Update:
    """A transaction step, and a guard: set *entry*'s value, only if it still exists as
    given (same creation revision, same version). It keeps its revision and lease.

    On ZooKeeper the creation is told by the name alone (its multi compares a node's
    version, not its czxid): a waiter entry's sequential name is not given twice while
    its parent node lives, but once the parent was removed (an emptied container) the
    same name can be made again, and it matches at version 0. A caller that keeps an
    entry across such a time must read it again before guarding a write with it."""

    entry: Entry
    value: bytes


@dataclass(frozen=True)
class Remove:
    """A transaction step, and a guard: delete *entry*, only if it still exists as given
    (same creation revision, same version; on ZooKeeper see :class:`Update`)."""

    entry: Entry


@dataclass(frozen=True)
class Check:
    """A guard and nothing else: the transaction happens only while *entry* exists as
    the same entry (same creation revision; its value and version may have changed).
    This is etcd's ``IsOwner()`` compare: "only while I still hold the lock"."""

    entry: Entry


@dataclass(frozen=True)
class Put:
    """A transaction step: write the plain key *key* (create it, or set its value), as
    :meth:`Backend.put` does with no lease. For keys that no lease binds (what a lease
    does to them is store-specific)."""

    key: str
    value: bytes


#: One step of :meth:`Backend.transact`.
Op = Create | Update | Remove | Check | Put


class Lease(ABC):
    """A session with the store: entries bound to it die with it.

    On etcd a lease kept alive by a keepalive stream; on ZooKeeper the connection's
    session. The backend keeps it alive in its own task group from :meth:`Backend.grant`
    until :meth:`revoke` or loss.

    A lease is lost when the store says so, and also, without anybody saying so, when its
    local :attr:`deadline` passes: the store may have expired it by then. Once lost it
    never comes back; a new lease is needed.

    Some stores can also be *interrupted* without losing the lease: on ZooKeeper a dropped
    connection (SUSPENDED) leaves the session alive for a while, but nobody can be sure
    that it still holds anything (Curator Tech Note 14). Every interruption voids what
    the lease's holders hold; waiters only wait for the connection to come back.
    """

    @property
    @abstractmethod
    def id(self) -> int:
        """The store's id of this lease."""

    @property
    @abstractmethod
    def ttl(self) -> float:
        """Seconds the store keeps the lease after the last acknowledged keepalive (the
        value the store granted, which may differ from the one asked for)."""

    @property
    @abstractmethod
    def deadline(self) -> float:
        """The local deadline, on the ``anyio.current_time()`` clock: the *send* time of
        the last request the store answered for this lease (the grant, then each
        acknowledged keepalive) plus :attr:`ttl`. The store cannot have expired the lease
        before it; after it, the lease must be presumed lost."""

    @property
    @abstractmethod
    def lost(self) -> bool:
        """True once the lease is known (or must be presumed) gone, including as soon as
        :attr:`deadline` has passed: no checkpoint is needed for that. Never becomes
        False again. Not a checkpoint."""

    @abstractmethod
    async def wait_lost(self) -> None:
        """Return when :attr:`lost` becomes true. A checkpoint."""

    @abstractmethod
    async def revoke(self) -> None:
        """Stop keepalive and end the lease on the store, deleting its entries. Marks the
        lease lost, whatever the outcome."""

    @property
    def interruptions(self) -> int:
        """How many times the connection was interrupted in a way that voids every hold
        granted before (ZooKeeper SUSPENDED under ``suspended_is_lost``). 0 on stores
        without the notion. Not a checkpoint."""
        return 0

    @property
    def interrupted(self) -> bool:
        """True while such an interruption lasts: grant nothing until it ends."""
        return False

    async def wait_interrupted(self, seen: int) -> None:
        """Return once :attr:`interruptions` exceeds *seen*, or the lease is lost."""
        await self.wait_lost()

    async def wait_resumed(self) -> None:
        """Return once the lease is not :attr:`interrupted` (or is lost). A checkpoint."""
        await anyio.lowlevel.checkpoint()


class Backend(AsyncResource):
    """A connection to one coordination store (an etcd cluster, a ZooKeeper ensemble).

    Opened with ``async with``; background tasks (keepalives, watch streams) run in a task
    group that the backend owns until :meth:`aclose`.
    """

    #: True if the backend runs on any anyio event loop, False if asyncio only.
    any_event_loop: bool = True
    #: Why a backend runs on asyncio only (for the error that refuses it elsewhere).
    asyncio_only_because: str = ""
    #: True if a registration cancelled in flight costs no more to undo than one that
    #: answered: the delete of its provisional entry waits for its answer, then deletes
    #: the entry it made by key (etcd's registrar, the memory store). A session then
    #: registers in its caller's task and undoes a cancelled registration by that
    #: delete. False (ZooKeeper: the delete searches the queue for the waiter id): the
    #: session finishes each registration in a task of its own, then deletes its entry.
    cheap_abandon: bool = False
    #: The longest lease TTL the store accepts, in seconds (checked when a client is made).
    max_ttl: float = math.inf
    #: The largest entry value this backend accepts in any write, in bytes: a value that
    #: fits is always writable again by an :class:`Update` in a transaction with small
    #: entries beside it (etcd's request limit is 1.5 MiB by default, ZooKeeper's
    #: ``jute.maxbuffer`` 1 MiB per request).
    max_value_size: int = 1_000_000
    #: The largest request this backend sends, in bytes as the store encodes it (keys
    #: with the namespace, values, and the protocol's framing), with a margin below the
    #: server's own limit: a write whose request would be larger (several large values
    #: in one transaction, say) raises ConfigurationError with nothing sent. So no call
    #: can make the server refuse a request, or drop the connection (ZooKeeper does, for
    #: a packet over ``jute.maxbuffer``: every hold of the client would go with it).
    #: Keys take at most 4,096 bytes (UTF-8, without the namespace) in any call, and a
    #: transaction at most :attr:`max_ops` operations.
    max_request_size: int = 1_040_000
    #: The most operations one :meth:`transact` takes: etcd refuses more than 128
    #: compares per transaction (``--max-txn-ops``), and an Update or a Remove is two of
    #: them there. A recipe writing many entries (a purge) splits them into transactions
    #: of at most this many.
    max_ops: int = 64
    #: The lock and election layouts this store speaks (see ``layout=`` of
    #: :meth:`coord.Client.mutex`): ``"coord"`` everywhere; ``"etcd"`` where
    #: :meth:`keys_by_creation` and :meth:`wait_keys_changed`, which etcd's Go
    #: ``concurrency`` package is made of, are served; ``"kazoo"`` and ``"curator"``
    #: where :meth:`create_sequential` and :meth:`child_names` are (and
    #: :meth:`wait_keys_changed`), which kazoo's and Curator's recipes are made of.
    layouts: frozenset[str] = frozenset({"coord"})

    @property
    def url(self) -> str:
        """Where this backend connects, as a URL with any password masked (for reprs and
        logs: never a secret)."""
        return f"{type(self).__name__.removesuffix('Backend').lower()}://"

    def __repr__(self) -> str:
        return f"<coord.{type(self).__name__} {self.url}>"

    @abstractmethod
    async def grant(self, ttl: float) -> Lease:
        """Create a lease of about *ttl* seconds and keep it alive until revoked or lost.

        The lease's deadline runs from the send time of the request that was answered,
        never from an earlier attempt that was not.
        """

    @abstractmethod
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
        """Create a waiter entry ``prefix + waiter_id[+ suffix]`` bound to *lease*, or a
        durable one (kept until deleted, e.g. a queued job) if *lease* is None.

        The entry is created and its position read atomically. Registering a *waiter_id*
        again after a call that did not answer (it raised :class:`BackendUnavailable`, or
        was cancelled) returns the entry that call made, if it made one: one waiter id
        never has two entries. A waiter id is fresh per acquire attempt; registering it
        again after its registration answered is a caller's error. The entry's key is
        ``prefix`` and then the waiter id, which a backend may precede with an order number
        or follow with a suffix that starts with ``-`` or ``:``
        (:func:`coord._core.keys.waiter_id_of` reads it back; a store may rename an entry
        that way, never change its waiter id). With
        ``ahead=0`` nothing but my entry is read (no listing of the queue).

        :param ahead: how many of the nearest entries ahead to return (``None``: all)
        :param kind: return only entries ahead whose waiter id starts with *kind* (e.g.
            the writers of a read-write lock, ``"@w"``); ``None``: every entry
        :raises ConfigurationError: for a value over :attr:`max_value_size`, a key over
            4,096 bytes or a request over :attr:`max_request_size` (nothing is sent)
        """

    @abstractmethod
    async def position(
        self, entry: Entry, *, ahead: int | None = 1, kind: str | None = None
    ) -> Position:
        """Read where *entry* stands now, checking atomically that it still exists.

        *ahead* and *kind* select the entries ahead returned, as for :meth:`register`.
        For a node that :meth:`create_sequential` made it only checks that the node
        still exists (the same node: same creation revision), and returns nothing ahead:
        the peer layouts order their queues themselves.

        :raises EntryGoneError: if *entry* no longer exists (its lease expired, or someone
            deleted it): the caller no longer owns anything (etcd #11456)
        """

    @abstractmethod
    async def wait_deleted(
        self, keys: Sequence[str], *, revision: int, entry: Entry | None = None
    ) -> Position | None:
        """Return once one of *keys* may have been deleted after *revision*, the store
        revision at which the caller read them (they existed then).

        Returns at once if that deletion already happened. May return spuriously (after
        a watch could not be resumed, or a ZooKeeper disconnect): callers re-check with
        :meth:`position`. Waits on the store's watch; never polls.

        *entry*, if given, is the caller's own waiter entry, registered with ``ahead=1``
        and no *kind* (an exclusive waiter), and *keys* the one entry right ahead of it.
        A backend that can then prove from what it saw that *entry* is now the first
        entry of its queue returns that position (nothing ahead, at the revision of the
        proof), sparing the caller its :meth:`position` read; None means "read".
        """

    @abstractmethod
    def guard(
        self, key: str, *, revision: int, on_change: Callable[[], None]
    ) -> Callable[[], None]:
        """Call *on_change* once *key* may have been deleted after *revision* (a store
        revision at which the caller read it: it existed then), or once the backend can no
        longer be sure to see its deletion (a watch that could not be resumed, a
        ZooKeeper disconnect): the caller re-reads, then guards it again.

        Unlike :meth:`wait_deleted` this costs no task of the caller's: a guard is a
        record in the backend's watch table (holds of locks guard their keys for as long
        as they are held, ten thousand at a time). Not a checkpoint: the watch is armed
        by the backend's own tasks, soon after. *on_change* is called at most once, in a
        task that is not the caller's (one of the backend's, or the one whose request
        deleted the key): it must not block or raise, and may start a task. Returns a
        function that stops the guard (idempotent; after it, *on_change* is not
        called).
        """

    @abstractmethod
    async def wait_changed(self, entry: Entry, *, revision: int) -> None:
        """Return once *entry* may no longer be as given: deleted, or its value written
        (a newer :attr:`Entry.version`) after *revision*, the store revision at which it
        was read.

        Returns at once if it already differs. May return spuriously (as
        :meth:`wait_deleted`): callers read it again. Waits on the store's watch.
        """

    @abstractmethod
    async def delete(self, entry: Entry) -> bool:
        """Delete *entry* only if it is still the same entry (same creation revision).

        A provisional entry (revision 0, registration outcome unknown) is deleted if it
        exists and is bound to this backend's lease; for one of :meth:`create_sequential`
        (key ``prefix + name``, its lease's id) that is the node found as that call's
        lost reply would find it.

        Returns False only when certainly nothing was deleted: the entry was not there.
        A request repeated after a reply was lost may find the entry gone because its
        first attempt deleted it; that answer is True.
        """

    @abstractmethod
    async def get(self, key: str) -> Entry | None:
        """Read one key (a plain key or a waiter entry), or None if it does not exist."""

    @abstractmethod
    async def find(self, prefix: str, waiter_id: str, lease: Lease | None) -> Entry | None:
        """The entry that :meth:`register` (or a :class:`Create`) made under *prefix*
        with *waiter_id*, bound to *lease* (None: a durable entry), or None if there is
        none now. Where the key holds more than the waiter id (a ZooKeeper sequence
        suffix, an etcd waiter's order number), one listing of *prefix* plus one read;
        otherwise one read. A recovery call, never on an acquire's path. Nothing changes
        on the store."""

    @abstractmethod
    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> Entry:
        """Write one plain key unconditionally: create it, or set its value.

        *lease* binds the key only when this write creates it; an existing key keeps
        its binding (ZooKeeper cannot move a node to another session, so no store does).

        :raises ConfigurationError: for a waiter key (a last segment starting with
            ``@``): only :meth:`register` creates those, so that :meth:`entries` lists
            exactly the registered entries on every store; or a value over
            :attr:`max_value_size` or a request over :attr:`max_request_size` (nothing
            is sent)
        :raises TypeError: for a key that is not a str or a value that is not bytes
        """

    @abstractmethod
    async def compare_and_set(
        self, key: str, value: bytes, *, version: int | None, lease: Lease | None = None
    ) -> Entry | None:
        """Write *key* only if its version is *version* (None: only if it does not exist).

        Returns the new entry, or None if the comparison failed. Not repeated after a
        lost reply (a repeat could report our own write as a conflict): the store may
        then raise BackendUnavailable with the write done. With a *version* it also
        updates a waiter entry (e.g. a leader's proclaimed value), keeping its creation
        revision and its lease; *lease* binds only a key this write creates.

        :raises ConfigurationError: to create (*version* None) a waiter key, or for a
            value over :attr:`max_value_size` or a request over :attr:`max_request_size`
            (nothing is sent)
        :raises TypeError: for a value that is not bytes
        """

    @abstractmethod
    async def transact(self, ops: Sequence[Op]) -> tuple[Entry | None, ...] | None:
        """Apply *ops* all together, or none of them.

        Every :class:`Update` and :class:`Remove` is also a guard: the transaction happens
        only if each of their entries still exists with the same creation revision and
        version (so "ack this job only while my claim is still mine" is one transaction
        removing both); a :class:`Check` guards only (same creation revision). Their
        entries must be waiter entries (made by :meth:`register` or a :class:`Create`);
        a :class:`Put` writes a plain key. Each key at most once per transaction. The
        entries its Creates make under one prefix are listed (:meth:`entries`) after every
        earlier one, and among themselves in the order of their Creates if their waiter
        ids sort in that order (they may share one creation revision).

        Returns None if a guard failed (nothing was written), else one item per op: the
        new entry of a Create or Update (all with the same new revision/version: the
        transaction's), None for a Remove, a Check or a Put. A checkpoint. Not repeated
        after a lost reply (it could then fail its own guards): BackendUnavailable means
        the outcome is unknown; read again to find out.

        :raises ConfigurationError: for an op on a key that is not a waiter entry (a Put
            on one that is), a key used twice, more than 64 ops, a value over
            :attr:`max_value_size`, or a request over :attr:`max_request_size` (nothing
            is sent)
        :raises TypeError: for a value that is not bytes
        :raises SessionExpiredError: if a Create's lease is lost
        """

    @abstractmethod
    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        """The waiter entries of *prefix* (those :meth:`register` made, keys ``prefix +
        "@..."``, never the keys of a nested name), oldest first, with the store
        revision at which they were read.

        :param stale_ok: the store may answer from the state its member has applied,
            without first confirming that it is the latest (etcd's serializable read): the
            listing may miss the latest changes, but is a state the store had at the
            revision it gives, never older than what this backend read before from the
            same member. For a caller that guards each write by what it read and watches
            from that revision. ZooKeeper and memory read so always."""

    @abstractmethod
    async def names(self, prefix: str = "") -> list[str]:
        """The names that have waiter entries, at or under *prefix*: every ``n`` for
        which some entry ``n + "/@..."`` exists, where ``n`` is *prefix* itself or starts
        with ``prefix + "/"`` (``""``: every name). Sorted; for tools that show what is
        held and waited for (``coord status``), not for recipes.

        A checkpoint; one read on etcd and memory, a walk of the tree on ZooKeeper (one
        listing per node under *prefix*), so not a snapshot there.
        """

    @abstractmethod
    def watch(
        self, prefix: str, *, revision: int
    ) -> AbstractAsyncContextManager[AsyncIterator[Change]]:
        """Watch the waiter entries of *prefix* (those :meth:`entries` lists) being
        created (PUT) and deleted (DELETE) after *revision*, a revision read from
        :meth:`entries` or :meth:`position`.

        ``async with backend.watch(p, revision=r) as changes: async for c in changes: ...``

        Value changes are not reported (ZooKeeper cannot watch every child's data
        cheaply): use :meth:`wait_changed` on the entries that matter. The iteration
        never ends on its own; when the store cannot deliver every change after
        *revision* (etcd compacted that history, ZooKeeper keeps none, a memory watcher
        fell behind) it raises :exc:`coord.ResyncNeeded`: read again, then watch from
        the new revision.
        """

    async def keys_by_creation(
        self,
        prefix: str,
        *,
        limit: int | None = None,
        newest_first: bool = False,
        created_before: int | None = None,
    ) -> Listing:
        """Every key that starts with *prefix* (plain keys and waiter entries alike,
        those of nested names too), ordered by creation revision, with the store
        revision of the read: what etcd's Go ``concurrency`` package reads
        (``WithFirstCreate`` for the holder or leader, ``WithLastCreate`` with
        ``WithMaxCreateRev`` in ``waitDeletes`` of ``key.go``). Only for stores whose
        :attr:`layouts` has ``"etcd"``; the others refuse it.

        :param limit: at most this many keys (None: all)
        :param newest_first: newest creation first
        :param created_before: only keys created before this revision
        :raises ConfigurationError: on a store that does not speak the etcd layout
        """
        raise _no_layout(self, "etcd")

    async def wait_keys_changed(self, prefix: str, *, revision: int) -> None:
        """Return once a key that starts with *prefix* may have been created, written
        or deleted after *revision* (a revision read from :meth:`keys_by_creation`):
        Go's ``Election.observe`` waiting for a first candidate. At once if that
        already happened; may return spuriously (callers read again). Waits on the
        store's watch; never polls.

        On a store of the kazoo and Curator layouts (ZooKeeper) *prefix* is a node's
        (``"name/"``), *revision* one read by :meth:`child_names`, and the change one of
        its direct children created or deleted (a children watch; an exists watch while
        the node is missing).

        :raises ConfigurationError: on a store that speaks none of those layouts
        """
        raise _no_layout(self, "etcd")

    async def create_sequential(
        self,
        prefix: str,
        name: str,
        lease: Lease,
        *,
        value: bytes = b"",
        containers: bool = True,
    ) -> Entry:
        """Create the ephemeral sequential node ``prefix + name + <sequence>`` holding
        *value*, bound to *lease* (ZooKeeper appends the 10-digit sequence: its order in
        the parent), and return it (revision: its czxid, the fence; lease: its
        ephemeralOwner). What kazoo's ``Lock`` and Curator's ``LockInternals`` create.

        *name* must hold a GUID fresh per attempt (Curator's protected mode, kazoo's
        uuid prefix): a create whose reply was lost is then looked for among the
        children of *prefix* and adopted only if its ephemeralOwner is *lease*'s session
        (CURATOR-498); the delete of the provisional entry ``Entry(prefix + name,
        lease=lease.id)`` finds it the same way. Missing parents are created first: as
        containers (Curator's ``creatingParentContainersIfNeeded``), or with
        ``containers=False`` as persistent nodes (kazoo's ``ensure_path``: a kazoo
        ``Lock`` creates its parent once, and would fail if the server reaped it).

        A checkpoint; not repeated after a lost reply other than by that search. Only
        for stores whose :attr:`layouts` has ``"kazoo"`` or ``"curator"``.

        :raises ConfigurationError: on a store that speaks neither layout; for a *name*
            with a ``/`` or starting with ``@`` (coord's waiter mark)
        :raises SessionExpiredError: if *lease* is lost
        :raises BackendUnavailable: if no reply came and no node of *name* was found
        """
        raise _no_layout(self, "kazoo", "curator")

    async def child_names(self, prefix: str) -> Children:
        """The raw names of the children of the node of *prefix* (``"name/"``), unsorted,
        with the revision of the read (empty, revision 0, if the node does not exist):
        what kazoo's and Curator's recipes list and sort by their own rules. A
        checkpoint; nothing changes on the store. Only for stores whose
        :attr:`layouts` has ``"kazoo"`` or ``"curator"``.

        :raises ConfigurationError: on a store that speaks neither layout
        """
        raise _no_layout(self, "kazoo", "curator")


def _no_layout(backend: Backend, *layouts: str) -> ConfigurationError:
    spoken = " or ".join(map(repr, layouts))
    return ConfigurationError(f"{type(backend).__name__} does not speak the {spoken} layout")
