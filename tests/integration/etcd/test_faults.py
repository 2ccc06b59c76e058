"""Faults that only a real etcd can show: a restart mid-wait, a SIGSTOPped server, a dead
endpoint in the list, a revoked lease the client does not know about yet."""

from __future__ import annotations

import anyio
import pytest

import coord
import coord.testing
from coord.testing import EtcdServer, free_port, wait_for_waiters
from coord.testing.pytest_plugin import fresh_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


async def test_restart_mid_wait_within_ttl(etcd_server: EtcdServer, etcd_url: str) -> None:
    """Waiters survive an etcd restart (their watches resume), and are served in order
    by exactly one holder at a time."""
    state = {"inside": 0, "max_inside": 0}
    order: list[int] = []
    async with coord.connect(etcd_url, ttl=10) as holder_client:
        holder = holder_client.mutex("restart")
        await holder.acquire()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(_waiter, etcd_url, i, order, state)
                    await wait_for_waiters(holder_client, "restart", i + 2)

                await anyio.to_thread.run_sync(etcd_server.restart)

                # Released right after the restart, while the waiters' watch streams may
                # still be reconnecting: the delete must reach the next waiter anyway.
                await holder.release()
    assert order == [0, 1, 2]
    assert state["max_inside"] == 1


async def _waiter(url: str, number: int, order: list[int], state: dict[str, int]) -> None:
    async with coord.connect(url, ttl=10) as client, client.mutex("restart"):
        state["inside"] += 1
        state["max_inside"] = max(state["max_inside"], state["inside"])
        order.append(number)
        await anyio.sleep(0.05)
        state["inside"] -= 1


async def test_sigstopped_server_holder_learns_loss_at_its_deadline(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    """A client that cannot reach the store declares its session lost at the TTL, from
    its own clock (measured from the last acknowledged keepalive's send time)."""
    async with coord.connect(etcd_url, ttl=2) as client:
        lost_after = None
        try:
            with pytest.raises(coord.LockLost):
                async with client.mutex("paused"):
                    start = anyio.current_time()
                    await anyio.to_thread.run_sync(etcd_server.pause)
                    try:
                        await anyio.sleep(30)
                    finally:
                        lost_after = anyio.current_time() - start
        finally:
            await anyio.to_thread.run_sync(etcd_server.resume)
        assert lost_after is not None
        assert lost_after <= 2.5, f"the holder was told {lost_after:.2f}s after the stall"
        assert client.session.lost


async def test_fails_over_from_a_dead_endpoint(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    url = f"etcd://{dead},{etcd_server.endpoint}/{fresh_namespace()}"
    with anyio.fail_after(10):
        async with coord.connect(url, ttl=5) as client:
            async with client.mutex("failover") as hold:
                assert hold.fence > 0


async def test_unreachable_store_is_backend_unavailable() -> None:
    url = f"etcd://127.0.0.1:{free_port()}"
    with anyio.fail_after(10), pytest.raises(coord.BackendUnavailable):
        async with coord.connect(url, ttl=5, request_timeout=0.5):
            pass


async def test_acquire_on_a_revoked_lease_moves_to_a_new_session(etcd_url: str) -> None:
    """The store revoked our lease and our keepalive has not noticed yet: registering a
    key on it is refused ("lease not found"). That answer is taken as the session's loss
    at once (not a store error, not a wait for the next keepalive), and the acquire goes
    on with a new session."""
    async with coord.connect(etcd_url, ttl=30) as client:
        first = client.session
        await coord.testing.expire_session(client)
        assert not first.lost  # the keepalive notices only at its next refresh (10 s)
        with anyio.fail_after(5):
            async with client.mutex("revoked") as hold:
                assert hold.session is not first
        assert first.lost
        assert client.statistics().sessions_lost == 1


async def test_namespaces_isolate(etcd_server: EtcdServer) -> None:
    a_url = f"{etcd_server.url}/{fresh_namespace()}"
    b_url = f"{etcd_server.url}/{fresh_namespace()}"
    async with coord.connect(a_url) as a, coord.connect(b_url) as b:
        async with a.mutex("same-name"):
            with anyio.fail_after(5):
                async with b.mutex("same-name"):  # another namespace: not blocked
                    pass


async def test_timeout_around_a_stalled_request_is_a_timeout(
    etcd_server: EtcdServer, etcd_url: str
) -> None:
    """A cancel scope firing while a gRPC request is in flight must surface as the scope's
    own cancellation (TimeoutError here), never as a foreign cancel of the caller."""
    async with coord.connect(etcd_url, ttl=5) as client:
        await anyio.to_thread.run_sync(etcd_server.pause)
        try:
            with pytest.raises(TimeoutError), anyio.fail_after(0.5):
                await client.backend.get("anything")
            with anyio.move_on_after(0.5) as scope:
                await client.mutex("stalled").acquire()
            assert scope.cancelled_caught
        finally:
            await anyio.to_thread.run_sync(etcd_server.resume)
        async with client.mutex("stalled"):  # and the client works again afterwards
            pass


async def test_a_session_granted_late_is_not_born_dead(etcd_server: EtcdServer) -> None:
    """connect() while etcd hangs (SIGSTOPped: it accepts, never answers), and it comes
    back after longer than the TTL: the grant is retried, and the lease's deadline runs
    from the attempt that was answered, not from the first one."""
    url = f"{etcd_server.url}/{fresh_namespace()}"
    await anyio.to_thread.run_sync(etcd_server.pause)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_resume_after, etcd_server, 4.0)
            with anyio.fail_after(20):
                async with coord.connect(url, ttl=3, request_timeout=10) as client:
                    assert not client.session.lost, client.session.reason
                    lease = client.session.lease
                    assert lease.deadline - anyio.current_time() > 1.0
                    await anyio.sleep(3.5)  # kept alive from there on
                    assert not client.session.lost
                    async with client.mutex("born") as hold:
                        assert hold.session is client.session
                    assert client.statistics().sessions_lost == 0
    finally:
        await anyio.to_thread.run_sync(etcd_server.resume)


async def _resume_after(server: EtcdServer, delay: float) -> None:
    await anyio.sleep(delay)
    await anyio.to_thread.run_sync(server.resume)
