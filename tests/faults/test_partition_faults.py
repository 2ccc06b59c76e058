"""The partitioner under faults (issue 19): worker processes share P = 64 partitions of one
partitioner on a 3-member etcd cluster or a 3-server ZooKeeper ensemble, each owner
writing through a store that fences writes per partition, while the test joins and
leaves members, pauses one past its TTL (SIGSTOP), kills one (SIGKILL), and cuts one off
through a TCP proxy. After each fault:

* every partition is owned again within TTL + 1 s (of the fault for the partitions of a
  member that dies; a paused or cut-off member's session must first expire), by a live
  member, and the shares are balanced (⌊P/M⌋ or ⌈P/M⌉ each);
* a clean join or leave moved at most what the balance needed;

and, with 4 members and P = 12, a connection reset of one member and the kill of the
store's leader (both survived by the sessions) move no partition to another member and
end no membership (issue 36);

and over the whole history: no two owners of a partition acted in overlapping intervals
unless the first was faulted and told (``DROP lost``) or killed, no write of a former
owner was accepted once the next one began, fences increase from owner to owner, and no
key is left once every worker has stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

import coord
from coord.testing import EtcdCluster, TcpProxy, ZooKeeperEnsemble
from coord.testing.pytest_plugin import fresh_namespace

from . import _partition_checks as checks
from ._partition_worker import NAME, PARTITIONS
from ._store import Event, FencedStore

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(240)]

TTL = 2.0
REOWNED = TTL + 1  # a dead member's partitions are owned again within this
SETTLE = 20  # a join or a leave is balanced again within this
# The leader-kill case's sessions: an election must end within a TTL for them to survive
# it, and with four workers on two cores a 3-member etcd cluster's election (500 ms
# timeout) and the keepalive retries after it took over 2 s twice in a row in the
# clean-clone CI (every session lost; 4/4 passed alone). What the case proves is that a
# session outliving the election moves no partition, not how fast the election is.
ELECTION_TTL = 5.0
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_partition_worker.py")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(
    params=[
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("zookeeper", marks=pytest.mark.zookeeper),
    ]
)
def cluster(request: pytest.FixtureRequest) -> Iterator[EtcdCluster | ZooKeeperEnsemble]:
    factory = EtcdCluster if request.param == "etcd" else ZooKeeperEnsemble
    with factory(3) as cluster:
        yield cluster


@dataclass
class Pool:
    """The worker processes and the fenced store."""

    directory: Path
    store: FencedStore = field(default_factory=FencedStore)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    left: set[str] = field(default_factory=set)
    faults: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def spawn(self, proc: str, url: str, partitions: int = PARTITIONS, ttl: float = TTL) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, str(WORKER), f"--url={url}", f"--store={self.store.endpoint}"]
        command += [f"--proc={proc}", f"--ttl={ttl}", f"--partitions={partitions}"]
        with (self.directory / f"{proc}.log").open("ab") as out:
            self.procs[proc] = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def members(self) -> set[str]:
        return set(self.procs) - self.killed - self.left

    def owners(self, dead: set[str] | None = None) -> dict[int, str]:
        return checks.owners(self.store.snapshot(), self.killed | (dead or set()))

    async def balanced(
        self, what: str, members: set[str], within: float = SETTLE, partitions: int = PARTITIONS
    ) -> dict[int, str]:
        """Until *members* own every partition between them, ⌊P/M⌋ or ⌈P/M⌉ each."""
        share = partitions // len(members)
        with anyio.move_on_after(within):
            while True:
                owned = self.owners(set(self.procs) - members)
                counts = [sum(1 for o in owned.values() if o == m) for m in members]
                if len(owned) == partitions and all(share <= c <= share + 1 for c in counts):
                    return owned
                await anyio.sleep(0.05)  # a test may poll its own store
        raise AssertionError(f"not balanced within {within:g}s {what}:\n{self.report()}")

    async def settled(self, url: str, partitions: int) -> dict[int, str]:
        """:meth:`balanced`, and until what the members hold is what the coordinator's
        stored record gives them: counts can balance while a move of an older record is
        still on its way, and that move would land after the fault under test."""
        members = self.members()
        async with coord.connect(url, ttl=TTL) as client:
            partitioner = client.partitioner(NAME, partitions=partitions)
            with anyio.move_on_after(SETTLE):
                while True:
                    owned = await self.balanced("settling", members, partitions=partitions)
                    names = {m.id: m.value.decode() for m in await partitioner.members()}
                    given = {p: names.get(m) for p, m in (await partitioner.assignment()).items()}
                    if given == owned and given == self.owners(set(self.procs) - members):
                        return owned
                    await anyio.sleep(0.05)  # a test may poll its own store
        raise AssertionError(f"not settled within {SETTLE}s on the record:\n{self.report()}")

    async def reowned(self, what: str, partitions: set[int], gone: str, since: float) -> float:
        """Until every one of *partitions* has an owner other than *gone*; returns how
        long after *since* the last was taken."""
        with anyio.move_on_after(REOWNED + 10):
            while True:
                owned = self.owners({gone})
                if all(p in owned for p in partitions):
                    break
                await anyio.sleep(0.05)
        taken = [
            t.began
            for p in partitions
            for t in checks.tenures(self.store.snapshot()).get(p, [])
            if t.proc != gone and t.began > since
        ]
        assert len({p for p in partitions if p in self.owners({gone})}) == len(partitions), (
            f"{what}: not owned again\n{self.report()}"
        )
        return max(taken) - since

    def report(self) -> str:
        owned = self.owners()
        lines = [f"owners: {sorted(owned.items())}"]
        for proc in self.procs:
            log = (self.directory / f"{proc}.log").read_text(errors="replace")
            lines.append(f"--- {proc} log tail:\n" + "\n".join(log.splitlines()[-15:]))
        return "\n".join(lines)

    async def stop(self) -> None:
        for popen in self.procs.values():
            if popen.poll() is None:
                popen.send_signal(signal.SIGCONT)
                popen.send_signal(signal.SIGTERM)
        for proc, popen in self.procs.items():
            try:
                await anyio.to_thread.run_sync(popen.wait, 15)
            except subprocess.TimeoutExpired:
                popen.kill()
                self.killed.add(proc)  # it could not tell: the checks know

    def close(self) -> None:
        for popen in self.procs.values():
            if popen.poll() is None:
                popen.send_signal(signal.SIGCONT)
                popen.kill()
                popen.wait(10)
        self.store.close()


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path)
    pool.store.start()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def proxy(cluster: EtcdCluster | ZooKeeperEnsemble) -> Iterator[TcpProxy]:
    """A proxy to the first member, for the member to cut off (made and closed outside
    the event loop: its thread is joined)."""
    with TcpProxy(int(cluster.members[0].endpoint.rpartition(":")[2])) as proxy:
        yield proxy


def story(events: list[Event], since: float, until: float) -> str:
    """What the members told the store after *since* (the fault) and before *until* (the
    stop), but their periodic writes."""
    return f"events from the fault to the stop (+{until - since:.3f}s):\n" + "\n".join(
        f"  +{e.at - since:6.3f}s {e.proc} {e.kind} {e.task} fence={e.fence} {e.detail}"
        for e in events
        if since < e.at < until and e.kind != "PWRITE"
    )


def moves(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(1 for p, owner in after.items() if before.get(p) != owner)


async def test_partitions_through_joins_leaves_pauses_kills_and_a_cut(
    pool: Pool, cluster: EtcdCluster | ZooKeeperEnsemble, proxy: TcpProxy
) -> None:
    namespace = fresh_namespace()
    url = f"{cluster.url}/{namespace}"
    scheme = "etcd" if isinstance(cluster, EtcdCluster) else "zk"
    timings: dict[str, float] = {}
    # Six members, then two join: each join moves only the newcomers' shares.
    pool.spawn("p0", f"{scheme}://{proxy.endpoint}/{namespace}")  # the one to cut off
    for number in range(1, 6):
        pool.spawn(f"p{number}", url)
    before = await pool.balanced("with 6 members", pool.members())
    for number in (6, 7):
        pool.spawn(f"p{number}", url)
    after = await pool.balanced("after 2 joins", pool.members())
    assert moves(before, after) <= checks.need(before, pool.members(), PARTITIONS)

    # A clean leave: only the leaver's partitions move.
    leaver = pool.procs["p7"]
    leaver.send_signal(signal.SIGTERM)
    pool.left.add("p7")
    before, after = after, await pool.balanced("after a leave", pool.members())
    assert moves(before, after) == checks.need(before, pool.members(), PARTITIONS)
    assert {p for p in after if after[p] != before[p]} == {
        p for p, o in before.items() if o == "p7"
    }

    # Paused past its TTL: its partitions are owned again once its session expires.
    paused = "p6"
    mine = {p for p, o in after.items() if o == paused}
    pool.procs[paused].send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    timings["paused"] = await pool.reowned("the paused member's", mine, paused, stopped_at)
    await anyio.sleep(max(stopped_at + 2 * TTL - time.monotonic(), 0))
    pool.procs[paused].send_signal(signal.SIGCONT)
    pool.faults[paused] = [(stopped_at, time.monotonic())]
    after = await pool.balanced("after the pause", pool.members())

    # Killed: the same, with nobody to tell.
    victim = "p5"
    mine = {p for p, o in after.items() if o == victim}
    pool.procs[victim].kill()
    killed_at = time.monotonic()
    pool.killed.add(victim)
    timings["killed"] = await pool.reowned("the killed member's", mine, victim, killed_at)
    after = await pool.balanced("after the kill", pool.members())

    # Cut off past its TTL, then healed.
    mine = {p for p, o in after.items() if o == "p0"}
    proxy.blackhole()
    cut_at = time.monotonic()
    timings["cut off"] = await pool.reowned("the cut-off member's", mine, "p0", cut_at)
    await anyio.sleep(max(cut_at + 2 * TTL - time.monotonic(), 0))
    proxy.heal()
    pool.faults["p0"] = [(cut_at, time.monotonic())]
    await pool.balanced("after the heal", pool.members())
    await pool.stop()

    events = pool.store.snapshot()
    handoffs = checks.check_history(events, pool.faults, pool.killed)
    assert handoffs >= 30
    rejected = sum(1 for e in events if e.kind == "PWRITE" and not e.accepted)
    told = sum(1 for e in events if e.kind == "DROP" and e.detail == "lost")
    print(f"re-owned after {timings}: {handoffs} handoffs, {rejected} refused, {told} lost")
    for what, took in timings.items():
        assert took <= REOWNED, f"{what}: partitions owned again {took:.2f}s after the fault"
    async with coord.connect(url, ttl=TTL) as client:
        with anyio.fail_after(TTL + 10):
            while names := await client.backend.names(NAME):  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert not names


async def test_a_blip_moves_only_the_blipped_members_own_partitions(
    pool: Pool, cluster: EtcdCluster | ZooKeeperEnsemble, proxy: TcpProxy
) -> None:
    """4 members, P = 12; one member's connections are reset (a blip its session
    survives). No partition of another member moves; the blipped member keeps its own or
    (on ZooKeeper, where SUSPENDED voids its holds) lets them go and takes them back. No
    membership is lost. (The moves of the leaves at the end are not the blip's.)"""
    partitions = 12
    namespace = fresh_namespace()
    url = f"{cluster.url}/{namespace}"
    scheme = "etcd" if isinstance(cluster, EtcdCluster) else "zk"
    pool.spawn("p0", f"{scheme}://{proxy.endpoint}/{namespace}", partitions)
    for number in (1, 2, 3):
        pool.spawn(f"p{number}", url, partitions)
    before = await pool.settled(url, partitions)
    blip_at = time.monotonic()
    proxy.reset()
    await anyio.sleep(TTL + 1)  # whatever the blip does is done by then
    # Settled, not only balanced: whatever move the blip set off has landed by the stop.
    after = await pool.settled(url, partitions)
    stop_at = time.monotonic()
    await pool.stop()

    events = pool.store.snapshot()
    taken = checks.taken(events, blip_at, stop_at)
    report = pool.report() + "\n" + story(events, blip_at, stop_at)
    assert all(proc == "p0" for proc, _ in taken), f"others' partitions moved: {taken}\n{report}"
    assert all(before[p] == "p0" for _, p in taken), f"moved to p0: {taken}\n{report}"
    assert after == before, report
    errors = [(e.proc, e.detail) for e in events if e.kind == "ERROR"]
    assert not errors, f"a membership was lost: {errors}"
    checks.check_history(events, {"p0": [(blip_at, blip_at + TTL)]}, pool.killed)


async def test_a_leader_kill_moves_no_partition(
    pool: Pool, cluster: EtcdCluster | ZooKeeperEnsemble
) -> None:
    """4 members, P = 12; the store's leader is killed (quorum kept). Every session
    survives the election, so no partition changes owner (on ZooKeeper, members whose
    connection dropped let theirs go and take them back) and no membership is lost. (The
    moves of the leaves at the end are not the kill's.)"""
    partitions = 12
    url = f"{cluster.url}/{fresh_namespace()}"
    for number in range(4):
        pool.spawn(f"p{number}", url, partitions, ttl=ELECTION_TTL)
    before = await pool.settled(url, partitions)
    leader = await anyio.to_thread.run_sync(cluster.wait_for_leader)
    killed_at = time.monotonic()
    await anyio.to_thread.run_sync(lambda: leader.stop(kill=True))
    await anyio.sleep(ELECTION_TTL + 1)
    # Settled, not only balanced: whatever move the kill set off has landed by the stop.
    after = await pool.settled(url, partitions)
    stop_at = time.monotonic()
    await pool.stop()

    events = pool.store.snapshot()
    taken = checks.taken(events, killed_at, stop_at)
    report = pool.report() + "\n" + story(events, killed_at, stop_at)
    assert all(before[p] == proc for proc, p in taken), f"moved: {taken}\n{report}"
    assert after == before, report
    errors = [(e.proc, e.detail) for e in events if e.kind == "ERROR"]
    assert not errors, f"a membership was lost: {errors}"
    checks.check_history(events, {}, pool.killed)
