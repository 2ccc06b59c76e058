"""A three-member etcd cluster: the member a client talks to dies, the client fails over."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import EtcdCluster, wait_for_waiters
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import EtcdServer

pytestmark = [pytest.mark.anyio, pytest.mark.etcd]


@pytest.fixture(scope="module")
def cluster(etcd_server: EtcdServer) -> Iterator[EtcdCluster]:
    del etcd_server  # only for the skip/fail policy when etcd is not installed
    with EtcdCluster(3) as cluster:
        yield cluster


async def test_member_dies_mid_wait(cluster: EtcdCluster) -> None:
    """Both clients talk to member 0 first. It is killed while one holds and one waits:
    the clients fail over, the lease survives, the waiter gets the lock after release."""
    url = f"{cluster.url}/{fresh_namespace()}"
    async with coord.connect(url, ttl=10) as a, coord.connect(url, ttl=10) as b:
        holder = a.mutex("failover")
        await holder.acquire()
        got = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                async with b.mutex("failover") as hold:
                    assert hold.fence > 0
                    got.set()

            tg.start_soon(waiter)
            await wait_for_waiters(a, "failover", 2)
            await anyio.to_thread.run_sync(lambda: cluster.members[0].stop(kill=True))
            try:
                with anyio.fail_after(15):
                    await holder.release()
                    await got.wait()
            finally:
                await anyio.to_thread.run_sync(cluster.members[0].start)
        assert not a.session.lost
        assert not b.session.lost


async def test_a_hung_member_costs_one_attempt_not_the_session(cluster: EtcdCluster) -> None:
    """The member the client talks to is SIGSTOPped: it accepts nothing and answers
    nothing, but resets no connection. Each request attempt has its own deadline, so the
    client moves on to a member that answers, and the keepalive does too within ttl / 3:
    requests succeed within seconds and the session survives."""
    url = f"{cluster.url}/{fresh_namespace()}"
    member = cluster.members[0]
    async with coord.connect(url, ttl=6) as client:
        session = client.session
        async with client.mutex("hung") as first:
            pass
        await anyio.to_thread.run_sync(member.pause)
        try:
            started = anyio.current_time()
            with anyio.fail_after(8):
                async with client.mutex("hung") as hold:
                    assert hold.fence > first.fence
            took = anyio.current_time() - started
            await anyio.sleep(7)  # longer than the TTL, still paused
            assert not session.lost, session.reason
            assert client.session is session
        finally:
            await anyio.to_thread.run_sync(member.resume)
    assert took < 6, f"the first request after the pause took {took:.1f}s"
