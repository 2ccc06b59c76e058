"""A connection blip does not reshuffle a partitioner: 4 members share P = 12 partitions,
each member's client behind its own TCP proxy; one proxy resets its connections (a blip
far shorter than the TTL, which the session survives). Members that saw no blip keep
every partition throughout; the blipped member ends with the partitions it had (on
ZooKeeper, whose SUSPENDED voids its holds, it lets them go and takes them back; on
etcd it keeps them)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import TcpProxy
from coord.testing.pytest_plugin import fresh_namespace

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coord.testing import EtcdServer, ZooKeeperServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

TTL = 4.0
MEMBERS = 4
PARTITIONS = 12
QUIET = 3.0  # settled: balanced, and no change for this long


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(
    params=[
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("zookeeper", marks=pytest.mark.zookeeper),
    ]
)
def server(request: pytest.FixtureRequest) -> EtcdServer | ZooKeeperServer:
    server: EtcdServer | ZooKeeperServer = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
def proxies(server: EtcdServer | ZooKeeperServer) -> Iterator[list[TcpProxy]]:
    port = int(server.endpoint.rpartition(":")[2])
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(TcpProxy(port)) for _ in range(MEMBERS)]


@dataclass
class Log:
    """What each member owns, and every change of it: (time, member, partition, +1/-1)."""

    owned: dict[str, set[int]] = field(default_factory=dict)
    changes: list[tuple[float, str, int, int]] = field(default_factory=list)
    rejoins: dict[str, int] = field(default_factory=dict)

    def saw(self, member: str, owned: frozenset[int]) -> None:
        mine = self.owned.setdefault(member, set())
        now = anyio.current_time()
        self.changes += [(now, member, p, +1) for p in sorted(owned - mine)]
        self.changes += [(now, member, p, -1) for p in sorted(mine - owned)]
        self.owned[member] = set(owned)

    def owners(self) -> dict[int, str]:
        return {p: member for member, mine in self.owned.items() for p in mine}

    def balanced(self) -> bool:
        share = PARTITIONS // MEMBERS
        counts = [len(mine) for mine in self.owned.values()]
        owned = [p for mine in self.owned.values() for p in mine]
        return (
            len(counts) == MEMBERS
            and sorted(owned) == list(range(PARTITIONS))
            and all(count == share for count in counts)
        )

    async def settled(self, what: str, within: float = 40) -> dict[int, str]:
        since = anyio.current_time()
        with anyio.move_on_after(within):
            while True:
                last = max([since, *(change[0] for change in self.changes[-1:])])
                if self.balanced() and anyio.current_time() - last >= QUIET:
                    return self.owners()
                await anyio.sleep(0.05)
        raise AssertionError(f"not settled within {within:g}s {what}: {self.owned}")


async def member(client: coord.Client, name: str, log: Log) -> None:
    partitioner = client.partitioner("blip/parts", partitions=PARTITIONS)
    while True:
        try:
            async with partitioner.join(name.encode()) as owner:
                async for assignment in owner.assignments():
                    log.saw(name, assignment.owned)
        except coord.MembershipLost:
            pass
        log.saw(name, frozenset())
        log.rejoins[name] = log.rejoins.get(name, 0) + 1
        await anyio.sleep(0.3)


async def test_a_blip_of_one_member_moves_no_other_members_partitions(
    server: EtcdServer | ZooKeeperServer, proxies: list[TcpProxy]
) -> None:
    namespace = fresh_namespace()
    scheme = server.url.partition("://")[0]
    log = Log()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                coord.connect(f"{scheme}://{proxy.endpoint}/{namespace}", ttl=TTL)
            )
            for proxy in proxies
        ]
        async with anyio.create_task_group() as tg:
            for number, client in enumerate(clients):
                tg.start_soon(member, client, f"m{number}", log)
            before = await log.settled("after the joins")
            mark = len(log.changes)
            proxies[0].reset()  # m0's connections are reset; it reconnects at once
            after = await log.settled("after the blip")
            tg.cancel_scope.cancel()
    changes = log.changes[mark:]
    others = [c for c in changes if c[1] != "m0"]
    assert not others, f"members that saw no blip had partitions moved: {others}"
    assert after == before, f"the blipped member did not get its partitions back: {changes}"
    assert not any(c[3] > 0 and before[c[2]] != c[1] for c in changes), changes
    assert not log.rejoins, f"a membership was lost: {log.rejoins}"
    if scheme == "zk":  # SUSPENDED voided m0's partition holds: it let go and took them back
        assert {c[2] for c in changes if c[3] < 0} == {p for p, m in before.items() if m == "m0"}
