"""Faults between one client and ZooKeeper, injected with coord.testing.TcpProxy; and what
they log: an outage of a few seconds, in which the client retries many times, shows as a
handful of lines, not dozens (each failed attempt is logged at DEBUG only)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import TcpProxy, wait_for_waiters
from coord.testing.pytest_plugin import fresh_namespace

from .._stall import holder_stalled_past_its_ttl, holder_stalled_within_its_ttl

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.zookeeper]


@pytest.fixture
def proxy(zookeeper_server: ZooKeeperServer) -> Iterator[TcpProxy]:
    with TcpProxy(zookeeper_server.port) as proxy:
        yield proxy


@pytest.mark.parametrize("suspended_is_lost", [False, True])
async def test_a_cut_off_holder_knows_before_anyone_else_can_hold(
    zookeeper_server: ZooKeeperServer, proxy: TcpProxy, suspended_is_lost: bool
) -> None:
    """The holder is cut off from the ensemble (a partition: nothing gets through, no
    connection is reset). The server expires its session one timeout after it last heard
    from it, and the next waiter gets the lock. The holder must know that it lost the
    lock no later than that moment (it used to learn it seconds later, with
    suspended_is_lost=False: a timer started at SUSPENDED and ran the requested timeout)."""
    ttl = 2.0
    namespace = fresh_namespace()
    url = f"zk://{proxy.endpoint}/{namespace}"
    times: dict[str, float] = {}
    async with (
        coord.connect(url, ttl=ttl, suspended_is_lost=suspended_is_lost) as holder,
        coord.connect(f"{zookeeper_server.url}/{namespace}", ttl=ttl) as other,
    ):
        async with anyio.create_task_group() as tg:

            async def next_holder() -> None:
                async with other.mutex("cut"):
                    times["next"] = anyio.current_time()

            with anyio.fail_after(15), pytest.raises(coord.LockLost):
                async with holder.mutex("cut") as hold:
                    tg.start_soon(next_holder)
                    await wait_for_waiters(other, "cut", 2)
                    proxy.blackhole()
                    times["cut"] = anyio.current_time()
                    await hold.wait_lost()
                    times["told"] = anyio.current_time()
                    await anyio.sleep_forever()
        proxy.heal()
        assert times["told"] <= times["next"], times
        assert times["told"] - times["cut"] <= ttl + 0.5, times
        with anyio.fail_after(15):  # the holder's client carries on, unrestarted
            async with holder.mutex("cut") as again:
                assert again.fence > hold.fence


async def test_a_holder_stalled_past_its_ttl_gets_lock_lost(
    zookeeper_server: ZooKeeperServer, proxy: TcpProxy
) -> None:
    namespace = fresh_namespace()
    await holder_stalled_past_its_ttl(
        f"zk://{proxy.endpoint}/{namespace}", f"{zookeeper_server.url}/{namespace}", proxy
    )


async def test_an_outage_is_a_few_lines_with_a_count(
    proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, each connection attempt too
    url = f"zk://{proxy.endpoint}/{fresh_namespace()}"
    async with coord.connect(url, ttl=10) as client:
        caplog.clear()
        proxy.refuse()
        proxy.reset()
        await anyio.sleep(5)
        proxy.heal()
        with anyio.fail_after(10):
            await client.session.lease.wait_resumed()  # the same session, back
        assert not client.session.lost
        records = list(caplog.records)
    failed = [r for r in records if r.getMessage().startswith("connecting to ZooKeeper")]
    assert len(failed) >= 3, [r.getMessage() for r in records]  # it did retry, quietly:
    assert all(r.levelno == logging.DEBUG for r in failed)
    visible = [f"{r.levelname} {r.getMessage()}" for r in records if r.levelno >= logging.INFO]
    assert len(visible) <= 6, visible
    lost = [line for line in visible if "connection to ZooKeeper" in line and "lost" in line]
    assert len(lost) == 1, visible
    assert lost[0].startswith(f"WARNING connection to ZooKeeper {url} lost (")
    assert lost[0].endswith("); retrying")
    back = [line for line in visible if "is back after" in line]
    assert len(back) == 1, visible
    assert f"({len(failed)} failed attempts)" in back[0], (back, len(failed))


async def test_a_holder_stalled_within_its_ttl_keeps_its_hold(
    zookeeper_server: ZooKeeperServer,
) -> None:
    await holder_stalled_within_its_ttl(f"{zookeeper_server.url}/{fresh_namespace()}")
