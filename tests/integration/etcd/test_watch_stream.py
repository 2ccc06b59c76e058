"""The etcd watch stream (coord/backends/etcd/_watch.py) against a real server: pipelined
creations with client-assigned ids, refusals, cancels of watches not yet created, guards
armed while the stream is down, and what the server is left holding."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest
import sniffio

import coord
from coord.backends.etcd import EtcdBackend
from coord.backends.etcd._connection import finish, stream_read
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from coord.testing import EtcdServer, TcpProxy

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


def _backend(client: coord.Client) -> EtcdBackend:
    backend = client.backend
    assert isinstance(backend, EtcdBackend)
    return backend


async def _server_watchers(server: EtcdServer) -> float:
    return await anyio.to_thread.run_sync(
        lambda: server.metric("etcd_debugging_mvcc_watcher_total")
    )


async def test_a_refused_creation_ends_its_watch(etcd_url: str) -> None:
    """etcd answers a creation it refuses with ``created`` and ``canceled`` and watch id
    -1 (``InvalidWatchID``), not the id we assigned: on every etcd for an empty range, and
    on etcd 3.5+ for every refusal (permission denied, *invalid auth token*). Creations
    are answered in the order they were sent, so the refusal is the oldest unanswered
    one's. It was ignored: the watch waited forever for events that never come (and a
    stale token never triggered the re-login), while later watches worked."""
    async with coord.connect(etcd_url, ttl=5) as client:
        stream = _backend(client)._watches
        refused = await stream.open(b"b", b"a", start_revision=0)  # key >= range_end
        later = await stream.open(b"c", start_revision=0)
        with anyio.fail_after(5), pytest.raises(coord.BackendError, match="cancelled"):
            async for _ in refused:
                pass
        assert refused not in stream._active
        await refused.aclose()
        await later.aclose()


async def test_a_watch_closed_before_it_is_created_leaves_nothing_on_the_server(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    """Guards stopped at once (their creation sent, not yet answered): the server is
    sent a cancel for each, after its creation, and holds none of them afterwards.
    Pins a guarantee (passes on the reviewed code)."""
    async with coord.connect(etcd_url, ttl=5) as client:
        backend = _backend(client)
        before = await _server_watchers(etcd_server)
        stops = [backend.guard(f"g/{i}", revision=1, on_change=lambda: None) for i in range(300)]
        await anyio.lowlevel.checkpoint()  # the pump sends the first creations
        for stop in stops:
            stop()
        with anyio.fail_after(5):
            while await _server_watchers(etcd_server) > before:  # noqa: ASYNC110  (polled: counts, not events)
                await anyio.sleep(0.05)
        assert len(backend._watches) == 0
        assert not backend._watches._by_id


async def test_a_guard_armed_while_the_stream_is_down_is_created_when_it_is_back(
    etcd_server: EtcdServer, proxy: TcpProxy
) -> None:
    """A guard armed while the client is cut off from etcd is created once the stream is
    reopened, and calls back when its key is deleted; one stopped meanwhile is never
    created. Pins a guarantee (passes on the reviewed code)."""
    namespace = fresh_namespace()
    async with (
        coord.connect(f"etcd://{proxy.endpoint}/{namespace}", ttl=10) as client,
        coord.connect(f"{etcd_server.url}/{namespace}", ttl=10) as other,
    ):
        backend = _backend(client)
        kept = await other.backend.put("kept", b"")
        dropped = await other.backend.put("dropped", b"")
        fired: list[str] = []
        proxy.refuse()  # the stream breaks; it cannot reconnect while refused
        await anyio.sleep(0.5)
        backend.guard("kept", revision=kept.version, on_change=lambda: fired.append("k"))
        stop = backend.guard(
            "dropped", revision=dropped.version, on_change=lambda: fired.append("d")
        )
        stop()
        assert await other.backend.delete(dropped)
        proxy.heal()
        await anyio.sleep(1.5)  # reopened (backoff), the guard created
        assert fired == []
        assert await other.backend.delete(kept)
        with anyio.fail_after(5):
            while not fired:  # noqa: ASYNC110  (polled: counts, not events)
                await anyio.sleep(0.05)
        await anyio.sleep(0.3)
        assert fired == ["k"]
        assert len(backend._watches) == 0


async def test_a_wait_for_a_deletion_is_woken_at_once_though_writes_came_after_the_read(
    etcd_url: str,
) -> None:
    """A watch whose start revision is already past (any write since the waiter read its
    position, which on a busy lock is every time) is served by etcd's resync loop, every
    100 ms: each handoff waited up to 100 ms, and 8 contenders made 95 acquisitions/s.
    The wait's guard watches from its creation instead. Twenty handoffs that waited
    about 50 ms each took about a second; they now take a few milliseconds each."""
    async with coord.connect(etcd_url, ttl=30) as a, coord.connect(etcd_url, ttl=30) as b:
        backend_a, backend_b = _backend(a), _backend(b)
        lease_a, lease_b = a.session.lease, b.session.lease
        waited = 0.0
        for i in range(20):
            holder = await backend_a.register("h/", f"@w{i}a", lease_a)
            waiter = await backend_b.register("h/", f"@w{i}b", lease_b)
            assert waiter.ahead == (holder.entry,)
            await backend_a.put("elsewhere", b"%d" % i)  # the read is now in the past
            woken = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_wait_then_set, backend_b, holder.entry.key, waiter.revision, woken)
                await anyio.sleep(0.02)  # its guard is created meanwhile
                assert not woken.is_set()
                assert await backend_a.delete(holder.entry)
                started = anyio.current_time()
                with anyio.fail_after(5):
                    await woken.wait()
                waited += anyio.current_time() - started
            assert await backend_b.delete(waiter.entry)
        assert waited < 0.4, f"20 handoffs waited {waited:.2f}s for the deletion event"


async def test_a_deletion_between_the_read_and_the_watch_is_not_missed(etcd_url: str) -> None:
    """The guard watches from its creation: a deletion after the caller's read and before
    the creation is no event of it, and the wait reads the keys once to see it."""
    async with coord.connect(etcd_url, ttl=30) as a:
        backend = _backend(a)
        lease = a.session.lease
        first = await backend.register("g/", "@w1", lease)
        second = await backend.register("g/", "@w2", lease)
        assert await backend.delete(first.entry)  # after second's read
        with anyio.fail_after(5):
            await backend.wait_deleted([first.entry.key], revision=second.revision)
        # And with no write since the read, a wait lasts until the deletion.
        third = await backend.register("g/", "@w3", lease)
        with anyio.move_on_after(0.3) as waiting:
            await backend.wait_deleted([second.entry.key], revision=third.revision)
        assert waiting.cancelled_caught


async def _wait_then_set(backend: EtcdBackend, key: str, revision: int, woken: anyio.Event) -> None:
    await backend.wait_deleted([key], revision=revision)
    woken.set()


async def test_a_stream_read_is_cancelled_by_its_scope_or_ended_by_grpc(etcd_url: str) -> None:
    """stream_read awaits the call's read directly: our own cancel scope stops it as a
    cancellation, and the call ended under it (another task cancels it, as the lease's
    keepalive does when it drops its stream) is BackendUnavailable, not a bare
    CancelledError that would escape every cancel scope around it."""
    async with coord.connect(etcd_url, ttl=5) as client:
        conn = _backend(client)._conn
        call = conn.watch.Watch(metadata=conn.metadata(require_leader=True))
        try:
            with anyio.move_on_after(0.2) as scope:
                await stream_read(call)  # nothing to read: no watch on this stream
            assert scope.cancelled_caught
        finally:
            finish(call)
        if sniffio.current_async_library() == "asyncio":  # a native cancellation, too
            call = conn.watch.Watch(metadata=conn.metadata(require_leader=True))
            try:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await stream_read(call)
            finally:
                finish(call)
        call = conn.watch.Watch(metadata=conn.metadata(require_leader=True))
        try:
            async with anyio.create_task_group() as tg:

                async def end_it() -> None:
                    await anyio.sleep(0.1)
                    call.cancel()

                tg.start_soon(end_it)
                with anyio.fail_after(5), pytest.raises(coord.BackendUnavailable):
                    await stream_read(call)
        finally:
            finish(call)
