"""The ZooKeeper backend beneath the contract: node layout, fences, containers, watches,
leases, plain keys, trio, and what it leaves behind."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import coord
from coord.abc import ChangeKind, Create, Entry, Update
from coord.backends.zookeeper import ZooKeeperBackend
from coord.backends.zookeeper._wire._connection import Connection
from coord.testing import ZooKeeperServer, drop_key, wait_for_waiters

from ._support import backend_of, raw_client

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


def _chroot(url: str) -> str:
    return url.rsplit("/", 1)[1]


@pytest.fixture
async def backend(zookeeper_url: str) -> AsyncIterator[ZooKeeperBackend]:
    async with coord.connect(zookeeper_url, ttl=5) as client:
        yield backend_of(client)


async def test_waiter_node_layout_and_fence(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """``/<chroot>/<name>/@w<guid>-<10-digit seq>`` (``w``: an exclusive waiter),
    ephemeral, owned by the session; the fence is the node's czxid (global), not its
    sequence number (per parent)."""
    async with raw_client(zookeeper_server.endpoint) as observer:
        async with coord.connect(zookeeper_url, ttl=5) as client:
            async with client.mutex("orders/42") as hold:
                prefix, _, name = hold.key.rpartition("/")
                guid, _, sequence = name.rpartition("-")
                assert prefix == "orders/42"
                assert guid.startswith("@w")
                assert len(guid) == 34
                assert len(sequence) == 10
                assert sequence.isdigit()
                path = f"/{_chroot(zookeeper_url)}/{hold.key}"
                _, stat = await observer.get_data(path)
                assert hold.fence == stat.czxid << 16  # czxid << 16 | seq (0: strict)
                assert stat.ephemeralOwner == client.session.lease.id
            async with client.mutex("orders/43") as other:
                assert other.key.endswith("-0000000000")  # a new parent: sequence restarts
                assert other.fence > hold.fence  # ... the fence does not


async def test_empty_lock_parents_are_removed(
    zookeeper_server: ZooKeeperServer, zookeeper_url: str
) -> None:
    """Lock parents are container nodes: the server deletes them once empty (checked
    every second by the test server), so they never pile up."""
    parent = f"/{_chroot(zookeeper_url)}/reaped"
    async with raw_client(zookeeper_server.endpoint) as observer:
        async with coord.connect(zookeeper_url, ttl=5) as client:
            async with client.mutex("reaped"):
                assert await observer.exists(parent)
            with anyio.fail_after(10):
                # Polled: the server reaps containers on a timer, and says nothing.
                while await observer.exists(parent):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            async with client.mutex("reaped"):  # and it comes back when needed
                pass


async def test_watch_from_a_revision_with_a_gap_says_resync(
    backend: ZooKeeperBackend, other: coord.Client
) -> None:
    """A watch from a listing's revision (the parent's pzxid) cannot name what changed
    between the listing and the watch (ZooKeeper keeps no names of deleted children): it
    raises ResyncNeeded rather than miss it; a watch from a fresh listing reports each
    change by name."""
    theirs = backend_of(other)
    first = await theirs.register("gap/", f"@{uuid.uuid4().hex}", other.session.lease)
    listing = await backend.entries("gap/")
    assert [e.key for e in listing.entries] == [first.entry.key]
    await theirs.register("gap/", f"@{uuid.uuid4().hex}", other.session.lease)
    with anyio.fail_after(5):
        async with backend.watch("gap/", revision=listing.revision) as changes:
            with pytest.raises(coord.ResyncNeeded):
                await changes.__anext__()
        listing = await backend.entries("gap/")
        async with backend.watch("gap/", revision=listing.revision) as changes:
            await theirs.delete(first.entry)
            change = await changes.__anext__()
            assert change.kind is ChangeKind.DELETE
            assert change.entry.key == first.entry.key
    # Up to date: a watch from the current revision reports nothing until a change.
    listing = await backend.entries("gap/")
    async with backend.watch("gap/", revision=listing.revision) as changes:
        with anyio.move_on_after(0.3) as quiet:
            await changes.__anext__()
        assert quiet.cancelled_caught


async def test_wait_deleted_returns_at_once_and_leaves_no_listener(
    backend: ZooKeeperBackend, other: coord.Client
) -> None:
    registry = backend._watches
    with anyio.fail_after(5):
        await backend.wait_deleted(["nowhere/@x-0000000000"], revision=0)  # no such node
        position = await backend_of(other).register(
            "wait/", f"@{uuid.uuid4().hex}", other.session.lease
        )
        woken = anyio.Event()

        async def wait() -> None:
            await backend.wait_deleted([position.entry.key], revision=position.revision)
            woken.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.1)
            assert not woken.is_set()
            await drop_key(other, position.entry.key)
        held = await backend_of(other).register("wait/", "@z", other.session.lease)
        with anyio.move_on_after(0.1) as scope:  # cancelled while waiting
            await backend.wait_deleted([held.entry.key], revision=held.revision)
        assert scope.cancelled_caught
    assert not any(registry._listeners.values())


async def test_an_exclusive_registration_arms_the_watch_its_wait_needs(
    backend: ZooKeeperBackend, other: coord.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of the one entry ahead of an exclusive waiter arms its data watch: the
    wait sends no request of its own, and a predecessor gone before the wait began (its
    watch fired with no listener yet) still ends the wait at once."""
    lease = backend._lease
    assert lease is not None
    client = backend._conn.client
    assert client is not None
    ahead = await backend_of(other).register("armed/", f"@{uuid.uuid4().hex}", other.session.lease)
    mine = await backend.register("armed/", f"@{uuid.uuid4().hex}", lease, ahead=1)
    assert [e.key for e in mine.ahead] == [ahead.entry.key]
    path = backend._paths.path(ahead.entry.key)
    assert client.data_watched(path, backend._watches.data_watcher)
    sent: list[str] = []
    real = Connection.submit

    def counting(self: Connection, request: Any, arming: Any = None) -> Any:
        sent.append(type(request).__name__)
        return real(self, request, arming)

    monkeypatch.setattr(Connection, "submit", counting)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            woken = anyio.Event()

            async def wait() -> None:
                await backend.wait_deleted([ahead.entry.key], revision=mine.revision)
                woken.set()

            tg.start_soon(wait)
            await anyio.sleep(0.1)
            assert not woken.is_set()
            assert "GetData" not in sent, sent  # (the wait sent no read)
            await drop_key(other, ahead.entry.key)
        # Gone before the wait: the watch fired with nobody listening; the wait reads.
        ahead = await backend_of(other).register(
            "armed/", f"@{uuid.uuid4().hex}", other.session.lease
        )
        mine2 = await backend.register("armed/", f"@{uuid.uuid4().hex}", lease, ahead=1)
        assert [e.key for e in mine2.ahead] == [ahead.entry.key]
        path = backend._paths.path(ahead.entry.key)
        fired = anyio.Event()
        with backend._watches.listening("data", [path], fired.set):
            await drop_key(other, ahead.entry.key)
            await fired.wait()
        assert not client.data_watched(path, backend._watches.data_watcher)
        await backend.wait_deleted([ahead.entry.key], revision=mine2.revision)
    await backend.delete(mine.entry)
    await backend.delete(mine2.entry)


async def test_one_lease_per_backend(zookeeper_server: ZooKeeperServer) -> None:
    hosts = [("127.0.0.1", zookeeper_server.port)]
    async with ZooKeeperBackend(hosts, namespace=f"t{uuid.uuid4().hex[:12]}") as backend:
        lease = await backend.grant(3)
        assert lease.ttl == 3
        with pytest.raises(coord.ConfigurationError, match="one lease"):
            await backend.grant(3)
        entry = await backend.put("session/key", b"v", lease=lease)
        assert entry.lease == lease.id
        await lease.revoke()
        assert lease.lost
        with pytest.raises(coord.SessionExpiredError):
            await backend.get("session/key")  # no session until the next grant
        again = await backend.grant(3)
        assert again.id != lease.id
        assert await backend.get("session/key") is None  # gone with its session
        with pytest.raises(coord.SessionExpiredError):
            await backend.register("x/", "@y", lease)


async def test_plain_keys(backend: ZooKeeperBackend) -> None:
    created = await backend.put("cfg/a", b"1")
    assert (created.value, created.version, created.lease) == (b"1", 0, 0)
    assert await backend.get("cfg/a") == created
    updated = await backend.put("cfg/a", b"2")
    assert (updated.revision, updated.version) == (created.revision, 1)
    assert await backend.compare_and_set("cfg/a", b"x", version=0) is None  # stale
    swapped = await backend.compare_and_set("cfg/a", b"3", version=1)
    assert swapped is not None
    assert swapped.version == 2
    assert await backend.compare_and_set("cfg/a", b"4", version=None) is None  # exists
    assert await backend.compare_and_set("cfg/b", b"5", version=None) is not None
    # delete() is guarded by the creation zxid: a re-created key is another entry.
    assert await backend.delete(created)
    recreated = await backend.put("cfg/a", b"6")
    assert not await backend.delete(created)
    assert await backend.get("cfg/a") == recreated
    assert await backend.get("cfg/missing") is None
    assert not await backend.delete(Entry("cfg/missing", revision=1))


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_runs_on_trio(zookeeper_url: str) -> None:
    assert ZooKeeperBackend.any_event_loop
    async with coord.connect(zookeeper_url, ttl=5) as a, coord.connect(zookeeper_url) as b:
        order: list[str] = []
        mutex = a.mutex("trio")
        with anyio.fail_after(10):
            first = await mutex.acquire()
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    async with b.mutex("trio") as second:
                        assert second.fence > first.fence
                        order.append("b")

                tg.start_soon(waiter)
                await wait_for_waiters(a, "trio", 2)  # entries, then a watch
                order.append("a")
                await mutex.release()
        assert order == ["a", "b"]
        with pytest.raises(coord.LockLost):
            async with a.mutex("trio") as hold:
                await drop_key(b, hold.key)
                await anyio.sleep_forever()


@pytest.fixture
async def bare(zookeeper_server: ZooKeeperServer) -> AsyncIterator[ZooKeeperBackend]:
    """A backend of its own, no client over it (its one lease is the test's)."""
    hosts = [("127.0.0.1", zookeeper_server.port)]
    async with ZooKeeperBackend(hosts, namespace=f"t{uuid.uuid4().hex[:12]}") as backend:
        yield backend


async def test_a_claim_shaped_multi_tells_its_new_node_without_reading_it(
    zookeeper_server: ZooKeeperServer, bare: ZooKeeperBackend
) -> None:
    """A multi that sets a node and creates an ephemeral one (a job's claim) answers the
    new node's entry from the set's stat, with no read after it: its revision is the
    node's czxid and its lease the node's owner, as the server has them."""
    lease = await bare.grant(5)
    job = (await bare.transact([Create("q/", "@j" + uuid.uuid4().hex, b"job")]))[0]  # type: ignore[index]
    assert job is not None
    await bare.transact([Create("c/", "@c" + uuid.uuid4().hex, b"", lease)])  # (its parent)
    reads: list[object] = []
    read = bare._multi._queues.read

    async def counting(
        prefix: str, names: Any, *, watch: bool = False, cached: bool = False
    ) -> Any:
        reads.append(names)
        return await read(prefix, names, watch=watch, cached=cached)

    bare._multi._queues.read = counting  # type: ignore[method-assign]
    try:
        result = await bare.transact(
            [Update(job, b"claimed"), Create("c/", "@c" + uuid.uuid4().hex, b"me", lease)]
        )
    finally:
        del bare._multi._queues.read
    assert result is not None
    updated, claim = result
    assert reads == []  # one request: nothing read back
    assert updated is not None
    assert claim is not None
    async with raw_client(zookeeper_server.endpoint) as observer:
        data, stat = await observer.get_data(bare._paths.path(claim.key))
        _, job_stat = await observer.get_data(bare._paths.path(job.key))
    assert (claim.revision, claim.lease, claim.version, claim.value) == (
        stat.czxid,
        stat.ephemeralOwner,
        stat.version,
        data,
    )
    assert claim.lease == lease.id
    assert updated.version == job_stat.version == 1
    assert job_stat.mzxid == stat.czxid


async def test_a_multi_of_creates_alone_is_answered_with_no_read_back(
    bare: ZooKeeperBackend, zookeeper_server: ZooKeeperServer
) -> None:
    """A put's multi (a job and its id marker, no set beside them) takes the new nodes'
    czxid from the answer's header: no read follows. A read would find the job gone if
    a fast worker had claimed and acked it meanwhile, and the put, done, was told
    "unknown" (a clean-clone CI failure of test_queue_crash)."""
    lease = await bare.grant(5)
    await bare.transact([Create("p/", "@j" + uuid.uuid4().hex, b"")])  # (the parents)
    await bare.transact([Create("i/", "@i" + uuid.uuid4().hex, b"")])
    reads: list[object] = []
    read = bare._multi._queues.read

    async def counting(
        prefix: str, names: Any, *, watch: bool = False, cached: bool = False
    ) -> Any:
        reads.append(names)
        return await read(prefix, names, watch=watch, cached=cached)

    bare._multi._queues.read = counting  # type: ignore[method-assign]
    try:
        result = await bare.transact(
            [
                Create("p/", "@j" + uuid.uuid4().hex, b"job"),
                Create("i/", "@i" + uuid.uuid4().hex, b"marker"),
                Create("i/", "@e" + uuid.uuid4().hex, b"mine", lease),
            ]
        )
    finally:
        del bare._multi._queues.read
    assert reads == []
    assert result is not None
    async with raw_client(zookeeper_server.endpoint) as observer:
        for entry, value, owner in zip(
            result, (b"job", b"marker", b"mine"), (0, 0, lease.id), strict=True
        ):
            assert entry is not None
            data, stat = await observer.get_data(bare._paths.path(entry.key))
            assert (entry.revision, entry.value, entry.lease) == (stat.czxid, value, owner)
            assert data == value
        # All three are one transaction: one czxid.
        assert len({entry.revision for entry in result if entry is not None}) == 1


async def test_a_multi_is_not_sent_on_a_session_its_lease_is_not(
    bare: ZooKeeperBackend,
) -> None:
    """When the connection's session is not the lease's any more (it expired and the
    connection opened another before the lease heard), a multi creating the lease's
    nodes is not sent: it would make nodes nobody's lease stands for. It is refused as
    SessionExpiredError (not done), and nothing is created."""
    lease = await bare.grant(5)
    client = await bare._conn.current(5)
    real = client._session.session_id
    client._session.session_id = real + 1  # as if the connection had a new session
    try:
        with pytest.raises(coord.SessionExpiredError, match="not sent"):
            await bare.transact([Create("c/", "@c" + uuid.uuid4().hex, b"", lease)])
    finally:
        client._session.session_id = real
    assert (await bare.entries("c/")).entries == ()
