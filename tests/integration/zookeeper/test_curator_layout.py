"""The Curator layout on ZooKeeper, between coord clients: the nodes Curator's recipes
make (protected names, the id as a latch's data), FIFO, and what is refused. Against
real Curator (the Java peer of ``curator/CuratorPeer.java``): see
``test_curator_interop.py``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import anyio
import pytest

import coord

from ._kazoo import wait_children, zk_path
from ._support import raw_client

if TYPE_CHECKING:
    from coord.testing import ZooKeeperServer

pytestmark = [pytest.mark.zookeeper]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def connect(url: str) -> coord.Client:
    return coord.connect(url, ttl=5, layout="curator")


async def test_mutex_nodes_and_fifo(zookeeper_server: ZooKeeperServer, zookeeper_url: str) -> None:
    order: list[int] = []
    with anyio.fail_after(10):
        async with connect(zookeeper_url) as a, connect(zookeeper_url) as b:
            first = await a.mutex("m").acquire()
            assert re.fullmatch(r"m/_c_[0-9a-f-]{36}-lock-0000000000", first.key)
            async with raw_client(zookeeper_server.endpoint) as zk:
                _, stat = await zk.get_data(zk_path(zookeeper_url, first.key))
                assert first.fence == stat.czxid

            async def take(client: coord.Client, i: int) -> None:
                async with client.mutex("m"):
                    order.append(i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(take, b, 1)
                await wait_children(a, "m", 2)
                tg.start_soon(take, a, 2)
                await wait_children(a, "m", 3)
                assert [w.holding for w in await a.mutex("m").waiters()] == [True, False, False]
                await first._end()  # (the holding task's release, without its claim)
    assert order == [1, 2]


async def test_latch_leader_and_refusals(zookeeper_url: str) -> None:
    with anyio.fail_after(10):
        async with connect(zookeeper_url) as client:
            election = client.election("e")
            async with election.campaign(b"node-1") as term:
                assert re.fullmatch(r"e/_c_[0-9a-f-]{36}-latch-0000000000", term.key)
                leader = await election.leader()
                assert leader is not None
                assert (leader.value, leader.fence) == (b"node-1", term.fence)
            with pytest.raises(coord.ConfigurationError, match="no semaphore"):
                client.semaphore("s", 2, layout="curator")
            with pytest.raises(coord.ConfigurationError, match="cohort"):
                client.mutex("m", local_handoff=2)
            assert client.rwlock("rw").write.layout == "curator"
            assert client.semaphore("s", 2).layout == "coord"  # (no peer semaphore yet)
