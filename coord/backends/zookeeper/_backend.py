"""ZooKeeperBackend: coord's contract on a ZooKeeper ensemble, through the wire client."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from ..._core import keys as _keys
from ..._core.background import BackgroundTasks
from ..._core.checks import check_ttl
from ..._core.exceptions import ClosedError, ConfigurationError, SessionExpiredError
from ..._core.url import format_url
from ...abc import Backend, Change, Children, Entry, Lease, Listing, Position
from .._common.limits import check_ops, check_value
from .._common.tls import tls_files
from ._changes import ChildChanges
from ._connection import Connection
from ._faults import FaultHooks
from ._lease import SessionPolicy, ZooKeeperLease
from ._multi import Transactions
from ._nodes import Nodes
from ._options import Options, check_hosts, url_options
from ._paths import Paths, parse_waiter, sharded_name
from ._plain import PlainKeys
from ._sequential import SequentialNodes, check_node_name
from ._sizes import RequestSizes
from ._waitqueue import WaitQueues
from ._watches import WatchRegistry
from ._wire import State

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence

    from ..._core.url import ParsedURL
    from ...abc import Op
    from ._wire import WireClient

__all__ = ["ZooKeeperBackend"]


class ZooKeeperBackend(FaultHooks, Backend):
    """A connection to a ZooKeeper ensemble (3.5 or later). Use it through
    :func:`coord.connect`::

        coord.connect("zk://app:secret@10.0.0.1:2181,10.0.0.2:2181/myapp", ttl=10)
        coord.connect("zk://10.0.0.1:2281/myapp", ca_file="ca.pem")  # over TLS

    The lease is the ZooKeeper session: one per backend, its timeout is the ``ttl``
    (at most about 24 days: ZooKeeper counts it in 32-bit milliseconds; the server may
    clamp it further to its ``maxSessionTimeout``). Runs on asyncio and trio, with no
    thread: ZooKeeper's protocol is spoken by :mod:`._wire` on anyio.

    :param hosts: ``(host, port)`` pairs of the ensemble's members
    :param namespace: the root under which every key lives (``"myapp"`` -> ``/myapp``)
    :param auth: ``(user, password)`` for digest authentication, sent on every connect
    :param acl: ACL of every node created (kazoo ``ACL`` objects); default: "creator
        all" (only this user) with *auth*, "world all" without
    :param suspended_is_lost: a suspended connection voids every hold at once (Curator's
        default policy): holders are cancelled and told; the session itself lives on and
        waiters keep their place if the client resumes it in time. With False, holds
        survive a short drop: they end when the server says the session expired, or when
        the lease's local deadline passes (last acknowledged request + negotiated
        timeout)
    :param connect_timeout: how long opening the backend, and each new session, waits
        for a first answer from a member (reconnections within a session are bounded by
        the session timeout instead)
    :param ca_file: CA bundle (PEM) to verify the servers; enables TLS (the members'
        ``secureClientPort``)
    :param cert_file: client certificate (PEM) for mutual TLS, with *key_file*
    :param key_file: the client certificate's private key (PEM)
    :param tls: use TLS with the system's CA roots when no file is given
    """

    #: ZooKeeper sends the session timeout as a signed 32-bit number of milliseconds.
    max_ttl: float = (2**31 - 1) / 1000
    #: The server's ``jute.maxbuffer`` (1,048,575 bytes by default) less a margin: a
    #: request is measured as the packet sent (:mod:`._sizes`).
    max_request_size: int = 1_040_000
    #: coord's own, and kazoo's and Curator's recipes (:mod:`._sequential`).
    layouts: frozenset[str] = frozenset({"coord", "kazoo", "curator"})

    def __init__(
        self,
        hosts: Sequence[tuple[str, int]],
        *,
        namespace: str = "",
        auth: tuple[str, str] | None = None,
        acl: Sequence[Any] | None = None,
        suspended_is_lost: bool = True,
        connect_timeout: float = 10.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        tls: bool = False,
    ) -> None:
        self._hosts = check_hosts(hosts)
        self._options = Options.check(
            auth=auth,
            acl=acl,
            suspended_is_lost=suspended_is_lost,
            connect_timeout=connect_timeout,
            tls=tls_files(tls=tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file),
        )
        self._paths = Paths(namespace)
        self._sizes = RequestSizes(self._paths, self._options.acl, self.max_request_size)
        self._url = format_url("zk", self._hosts, namespace, auth[0] if auth else None)
        self._watches = WatchRegistry()
        self._policy = SessionPolicy(
            suspended_is_lost=self._options.suspended_is_lost,
            is_current=lambda client: client is self._conn.client,
            start_soon=self._start_soon,
            end_session=self._end_session,
        )
        self._conn = Connection(
            hosts=self._hosts,
            auth_data=self._options.auth_data,
            acl=self._options.acl,
            connect_timeout=self._options.connect_timeout,
            tls=self._options.tls,
            on_state=self._client_state,
            url=self._url,
        )
        self._nodes = Nodes(self._conn, self._paths)
        self._queues = WaitQueues(self._conn, self._nodes, self._paths, self._watches)
        self._plain = PlainKeys(self._conn, self._nodes, self._paths)
        self._multi = Transactions(self._conn, self._nodes, self._paths, self._queues)
        self._sequential = SequentialNodes(
            self._conn, self._nodes, self._paths, self._queues, self._watches
        )
        self._lease: ZooKeeperLease | None = None
        self._tg: BackgroundTasks | None = None
        self._grant_lock: anyio.Lock | None = None

    @classmethod
    def from_url(cls, url: ParsedURL, **options: Any) -> ZooKeeperBackend:
        """Build from a parsed ``zk://[user:password@]host:port,...[/chroot]`` URL and
        keyword options, checked here. Credentials in the URL are digest auth."""
        return cls(url.hosts, namespace=url.namespace, **url_options(url, options))

    @property
    def url(self) -> str:
        return self._url

    @property
    def suspended_is_lost(self) -> bool:
        return self._options.suspended_is_lost

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> ZooKeeperBackend:
        """Check that a member answers as ZooKeeper (within ``connect_timeout``), and
        start the backend's tasks. The session is opened by :meth:`grant`, or by the
        first request.

        :raises BackendUnavailable: if no member answers in ZooKeeper's protocol
        """
        await self._conn.first_contact()
        self._grant_lock = anyio.Lock()
        self._tg = BackgroundTasks()  # until aclose(), whatever scope around is cancelled
        try:
            await self._tg.open()
            self._conn.task_group = self._tg
            await self._tg.start(self._policy.run)
            await self._tg.start(self._watches.run)
        except BaseException:
            await self.aclose()  # (cancelled, say: nothing of it is left running)
            raise
        return self

    async def aclose(self) -> None:
        """Close the session (its ephemeral nodes go) and end the backend's tasks.
        Shielded."""
        tg, self._tg = self._tg, None
        if tg is None:
            return
        if self._lease is not None:
            self._lease._mark_lost("the backend was closed")
        try:
            await self._conn.close()
            self._watches.wake_all()
        finally:
            await tg.aclose()

    def _check_open(self) -> None:
        if self._tg is None:
            raise ClosedError("the ZooKeeper backend is not open")

    def _start_soon(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._tg is not None:
            self._tg.start_soon(func)

    def _client_state(self, client: WireClient, state: State) -> None:
        # From the wire client's task. The client keeps its watches across a resumed
        # session, but waiters re-check on a disconnect (what they wait for may have
        # happened while nobody could say), and every watch is gone once it is LOST.
        if state in (State.SUSPENDED, State.LOST) and client is self._conn.client:
            self._watches.wake_all()
        self._policy.notify(client, state, client.session_id)

    async def _end_session(self, session_id: int) -> None:
        await self._end_lease(session_id)()

    # -- leases ---------------------------------------------------------------------------

    async def grant(self, ttl: float) -> Lease:
        """Open a ZooKeeper session with a timeout of *ttl* seconds; it is the lease.

        A checkpoint. One lease per backend: a second grant while the first lives raises
        ConfigurationError; after it is lost or revoked, a grant opens a new session. The
        lease's TTL is the timeout the server negotiated, and its deadline runs from a
        request answered on the new session (not from the first connection attempt).

        :raises ConfigurationError: for a bad *ttl*, or a lease that is still live
        :raises BackendUnavailable: if every member refuses connections (at once), or
            none could be reached in ``connect_timeout``
        """
        self._check_open()
        ttl = check_ttl(ttl)
        assert self._grant_lock is not None
        assert self._tg is not None
        async with self._grant_lock:
            if self._lease is not None and not self._lease.lost:
                raise ConfigurationError(
                    "a ZooKeeper backend has one lease, its session: share it, or revoke it "
                    "before granting another"
                )
            conn = self._conn
            # A session opened lazily (by a request before any grant) becomes the lease
            # if its timeout fits; the session of an earlier lease is never reused.
            gone = conn.client is None or conn.client.state is State.LOST
            if gone or self._lease is not None or conn.timeout != ttl:
                await conn.open(ttl)
                self._watches.wake_all()
            conn.leased = True
            session_id = conn.session_id
            sent = anyio.current_time()
            timeout = await self._ping(session_id)
            lease = ZooKeeperLease(
                session_id, timeout, sent_at=sent, ping=self._ping, end=self._end_lease(session_id)
            )
            self._lease = self._policy.lease = lease
            await self._tg.start(lease.run)
            # A transition between the connect and now was ignored (no lease): apply it.
            state = conn.client.state if conn.client is not None else State.LOST
            if state is not State.CONNECTED:
                self._policy.on_state(state, session_id)
        return lease

    async def _ping(self, session_id: int) -> float:
        """One request on session *session_id* (kept alive by it); the negotiated session
        timeout, or SessionExpiredError if that session is no longer the client's."""
        conn = self._conn
        root = self._paths.root or "/"
        await conn.call("keepalive", lambda c: c.exists(root))
        if conn.session_id != session_id or conn.ended:
            raise SessionExpiredError(f"ZooKeeper session {session_id:#x} is over")
        return conn.negotiated

    def _end_lease(self, session_id: int) -> Callable[[], Awaitable[None]]:
        async def end() -> None:
            await self._conn.end(session_id)
            self._watches.wake_all()  # nothing more is delivered for that session

        return end

    def _session_of(self, lease: Lease) -> int:
        if lease is not self._lease or lease.lost:
            raise SessionExpiredError(f"lease {lease.id:#x} is not this backend's live session")
        return lease.id

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
        """Create my EPHEMERAL_SEQUENTIAL node (PERSISTENT_SEQUENTIAL if durable) and
        read where it stands.

        A checkpoint; two round trips: a listing, then the create with a second listing
        and the reads of the entries ahead pipelined behind it (one more read if an entry
        ahead changed in between). If cancelled, the node may exist: delete the
        provisional entry to clean up.

        :raises SessionExpiredError: if *lease* is lost
        """
        check_value(value, self.max_value_size, f"register {prefix + waiter_id!r}")
        self._sizes.check_write(prefix + waiter_id, value, "register", suffix="-")
        if lease is not None:  # and as it is named once moved into a shard
            sharded = sharded_name(f"{waiter_id}-{0:010d}", 0)
            self._sizes.check_write(prefix + sharded, value, "register")
        self._check_open()
        session_id = self._session_of(lease) if lease is not None else 0
        return await self._queues.register(prefix, waiter_id, session_id, value, ahead, kind)

    async def position(
        self, entry: Entry, *, ahead: int | None = 1, kind: str | None = None
    ) -> Position:
        """Read where *entry* stands. A checkpoint; one listing, plus one read per entry
        ahead returned (for a peer layout's node, one read: does it still exist).
        Nothing changes on the store, whether cancelled or not.

        :raises EntryGoneError: if the node no longer exists
        """
        self._check_open()
        if parse_waiter(entry.key.rpartition("/")[2]) is None:
            return await self._sequential.position(entry)
        return await self._queues.position(entry, ahead, kind)

    def wait_deleted(
        self, keys: Sequence[str], *, revision: int, entry: Entry | None = None
    ) -> Coroutine[Any, Any, None]:
        """Wait, with one data watch per key, until one of *keys* may be gone.

        A checkpoint. The watches are armed by reads done now, so *revision* is not
        needed: any deletion after the caller's read is either seen by them ("no node",
        return at once) or fires them. Returns spuriously after a disconnect. Cancelling
        it leaves the server watches in place, to fire once, harmlessly. Proves nothing
        of *entry* (None: the caller reads its position).
        """
        self._check_open()
        return self._queues.wait_deleted(keys)  # its coroutine: no frame of this call's

    def guard(
        self, key: str, *, revision: int, on_change: Callable[[], None]
    ) -> Callable[[], None]:
        """Guard *key* with one data watch, armed by a read sent now (see
        :meth:`coord.abc.Backend.guard`); also fires on a write and after a disconnect."""
        self._check_open()
        return self._queues.guard(key, revision, on_change)

    async def wait_changed(self, entry: Entry, *, revision: int) -> None:
        """Wait, with one data watch, until *entry* may be deleted or written.

        A checkpoint. The read that arms the watch compares the node's czxid and data
        version with *entry*'s, so *revision* is not needed. Returns spuriously after a
        disconnect.
        """
        self._check_open()
        await self._queues.wait_changed(entry, self._conn.timeout)

    async def delete(self, entry: Entry) -> bool:
        """Delete *entry* if it is still the same node.

        A checkpoint; repeated after a connection loss (then "no node" may mean that the
        first attempt worked). If cancelled, the delete may have happened.
        """
        self._check_open()
        if entry.provisional and not entry.key.rpartition("/")[2].startswith("@"):
            return await self._sequential.delete_provisional(entry)  # a peer layout's
        return await self._queues.delete(entry)

    async def transact(self, ops: Sequence[Op]) -> tuple[Entry | None, ...] | None:
        """One ``multi`` request (see :mod:`._multi`), plus one read of the nodes it
        creates unless a set in it tells their zxid. A checkpoint. Not repeated after a
        connection loss. If cancelled, it may have happened."""
        check_ops(ops, self.max_value_size)
        self._sizes.check_multi(ops)
        self._check_open()
        return await self._multi.transact(ops, self._session_of)

    async def entries(
        self, prefix: str, *, limit: int | None = None, stale_ok: bool = False
    ) -> Listing:
        """The waiter entries of *prefix*, oldest first, with the parent's pzxid as the
        revision (0 if it does not exist).

        A checkpoint; one listing, then the entries' reads pipelined in one round trip.
        Nothing changes on the store.
        """
        self._check_open()
        # A stale listing may take entries kept since the last one (as fresh as reads).
        return await self._queues.entries(prefix, limit, cached=stale_ok and limit is not None)

    async def names(self, prefix: str = "") -> list[str]:
        """The names with waiter nodes at or under *prefix*: a walk of the tree, one
        listing per node (not a snapshot). A checkpoint; nothing changes on the store."""
        self._check_open()
        found, level = [], [prefix]
        while level:
            below = []
            for key in level:
                node = self._paths.path(key).rstrip("/") or "/"
                listed = await self._queues.children(node)
                children = listed[0] if listed is not None else []
                if await self._queues.has_waiters(node, children):
                    found.append(key)
                below += [
                    f"{key}/{child}" if key else child
                    for child in children
                    if not child.startswith(_keys.WAITER_MARK) and (key or child != "zookeeper")
                ]
            level = below
        return sorted(found)

    # -- plain keys -----------------------------------------------------------------------

    async def get(self, key: str) -> Entry | None:
        """Read *key*. A checkpoint; nothing changes on the store."""
        self._check_open()
        return (await self._queues.read("", [key]))[0]

    async def find(self, prefix: str, waiter_id: str, lease: Lease | None) -> Entry | None:
        """Find the node of *waiter_id* (its name ends with a sequence number) among the
        children of *prefix*, owned by *lease*'s session (None: a durable node). A
        checkpoint: one listing, one read per candidate, one read of the node found."""
        self._check_open()
        _, node, _ = self._paths.split(prefix + waiter_id)
        owner = lease.id if lease is not None else 0  # (any session's: this only reads)
        found = await self._queues.find(node, waiter_id, owner)
        return None if found is None else await self.get(prefix + found[0])

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> Entry:
        """Write *key*: create it (ephemeral if *lease* is given), or set its data.

        A checkpoint. An existing node keeps its kind: ZooKeeper cannot bind a node to
        another session. Safe to repeat, so repeated after a connection loss (a create
        that did happen is then found, and its data set). If cancelled, the write may
        have happened.
        """
        _keys.check_plain_key(key, "put")
        check_value(value, self.max_value_size, f"put {key!r}")
        self._sizes.check_write(key, value, "put")
        self._check_open()
        if lease is not None:
            self._session_of(lease)  # raises unless it is this backend's live session
        return await self._plain.put(key, value, ephemeral=lease is not None)

    async def compare_and_set(
        self, key: str, value: bytes, *, version: int | None, lease: Lease | None = None
    ) -> Entry | None:
        """Write *key* if its data version is *version* (None: if it does not exist).

        A checkpoint. Not repeated after a connection loss: a repeat could report our
        own write as a conflict (BackendUnavailable is raised instead). If cancelled,
        the write may have happened.
        """
        if version is None:
            _keys.check_plain_key(key, "compare_and_set")
        check_value(value, self.max_value_size, f"compare_and_set {key!r}")
        self._sizes.check_write(key, value, "compare_and_set")
        self._check_open()
        if lease is not None and version is None:
            self._session_of(lease)
        return await self._plain.compare_and_set(key, value, version, ephemeral=lease is not None)

    # -- the peer layouts (kazoo's and Curator's recipes) ----------------------------------

    async def create_sequential(
        self,
        prefix: str,
        name: str,
        lease: Lease,
        *,
        value: bytes = b"",
        containers: bool = True,
    ) -> Entry:
        """Create the EPHEMERAL_SEQUENTIAL node ``prefix + name + <sequence>`` (see
        :meth:`coord.abc.Backend.create_sequential`). A checkpoint; one round trip (and
        the parents' creates, the first time); after a lost reply one listing and one
        read per node of *name*. If cancelled, the node may exist: delete the
        provisional entry to clean up."""
        check_node_name(name)
        check_value(value, self.max_value_size, f"create {prefix + name!r}")
        self._sizes.check_write(prefix + name + "0000000000", value, "create")
        self._check_open()
        session_id = self._session_of(lease)
        return await self._sequential.create(prefix, name, value, session_id, containers=containers)

    async def child_names(self, prefix: str) -> Children:
        """The children of *prefix*'s node, raw, with its pzxid. A checkpoint; one
        listing; nothing changes on the store."""
        self._check_open()
        return await self._sequential.children(prefix)

    async def wait_keys_changed(self, prefix: str, *, revision: int) -> None:
        """Until a child of *prefix*'s node may have been created or deleted since
        *revision* (a pzxid from :meth:`child_names`). A checkpoint; one children watch
        (an exists watch while the node is missing); spurious after a disconnect."""
        self._check_open()
        await self._sequential.wait_children_changed(prefix, revision)

    @asynccontextmanager
    async def watch(self, prefix: str, *, revision: int) -> AsyncIterator[AsyncIterator[Change]]:
        """Watch the direct children of *prefix*: creations and deletions after
        *revision* (a pzxid from :meth:`entries` or :meth:`position`). See
        :mod:`._changes` for what ZooKeeper can and cannot report.

        Entering is a checkpoint (one listing); each change is awaited on a children
        watch, re-armed by a listing after every event. Leaving stops listening; the
        server watch then fires once more, to nobody.
        """
        self._check_open()
        changes = ChildChanges(self._conn, self._queues, self._watches, self._paths, prefix)
        with (
            self._watches.listening("children", [changes.node], changes.wake),
            self._watches.listening("data", [changes.node], changes.wake),
        ):
            await changes.start(revision)
            try:
                yield changes
            finally:
                changes.close()
