"""election.observe() on real servers: from "no leader" through a term, a server restart,
another term and back to "no leader", and through lost watch history (compaction), with
one observer that never closes on its own (issue 7)."""

from __future__ import annotations

import itertools

import anyio
import pytest

import coord
from coord.testing import EtcdServer, ZooKeeperServer, compact

from ..contract._recorder import Recorder

pytestmark = pytest.mark.anyio

KINDS = [
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("zookeeper", marks=pytest.mark.zookeeper),
]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(kind: str, request: pytest.FixtureRequest) -> tuple[EtcdServer | ZooKeeperServer, str]:
    """This kind's shared server and a fresh URL on it (resolved before the event loop
    runs: fixture set-up reads files)."""
    server = request.getfixturevalue(f"{kind}_server")
    return server, str(request.getfixturevalue(f"{kind}_url"))


def values(seen: Recorder[coord.Leader | None]) -> list[bytes | None]:
    return [leader.value if leader else None for leader in seen.items]


@pytest.mark.timeout(60)
async def test_observe_through_terms_and_a_server_restart(
    kind: str, target: tuple[EtcdServer | ZooKeeperServer, str]
) -> None:
    server, url = target
    seen: Recorder[coord.Leader | None] = Recorder()

    async def observe(client: coord.Client) -> None:
        async for leader in client.election("restart").observe():
            seen.append(leader)

    async with (
        coord.connect(url, ttl=10) as watcher,
        coord.connect(url, ttl=10) as a,
        coord.connect(url, ttl=10) as b,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(observe, watcher)
        await seen.wait_for(lambda items: items == [None])
        try:
            async with a.election("restart").campaign(b"a"):
                await seen.wait_for(lambda items: values(seen)[-1:] == [b"a"])
                await anyio.to_thread.run_sync(server.restart)
                # etcd keeps the lease through a restart; ZooKeeper's default policy
                # voids the term (SUSPENDED), which raises LeadershipLost here.
                await a.election("restart").leader()
        except coord.LeadershipLost:
            assert kind == "zookeeper"
        async with b.election("restart").campaign(b"b") as term:
            await seen.wait_for(lambda items: values(seen)[-1:] == [b"b"])
            await term.proclaim(b"b2")
            await seen.wait_for(lambda items: values(seen)[-1:] == [b"b2"])
        await seen.wait_for(lambda items: values(seen)[-1:] == [None])
        tg.cancel_scope.cancel()
    observed = values(seen)
    assert observed[:2] == [None, b"a"]
    assert observed[-3:] == [b"b", b"b2", None]
    assert all(x != y for x, y in itertools.pairwise(observed)), observed


@pytest.mark.timeout(60)
async def test_observe_through_lost_history(
    target: tuple[EtcdServer | ZooKeeperServer, str],
) -> None:
    url = target[1]
    seen: Recorder[coord.Leader | None] = Recorder()
    async with (
        coord.connect(url, ttl=10) as watcher,
        coord.connect(url, ttl=10) as a,
        anyio.create_task_group() as tg,
    ):

        async def observe() -> None:
            async for leader in watcher.election("compacted").observe():
                seen.append(leader)

        async with a.election("compacted").campaign(b"a") as term:
            tg.start_soon(observe)
            await seen.wait_for(lambda items: values(seen) == [b"a"])
            for number in range(20):  # history the observer's watch starts before
                async with a.mutex(f"noise/{number}"):
                    pass
            await compact(a)
            await term.proclaim(b"a2")
            await seen.wait_for(lambda items: values(seen)[-1:] == [b"a2"])
        await seen.wait_for(lambda items: values(seen)[-1:] == [None])
        tg.cancel_scope.cancel()
    assert values(seen) == [b"a", b"a2", None]
