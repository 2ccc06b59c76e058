"""The etcd watch stream (coord/backends/etcd/_watch.py) against a real server: pipelined
creations with client-assigned ids, refusals, cancels of watches not yet created, guards
armed while the stream is down, and what the server is left holding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.backends.etcd import EtcdBackend
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
