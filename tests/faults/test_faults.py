"""The fault suite: worker processes contend for one mutex (or campaign in one election)
through a fenced store while the test pauses, kills and cuts off holders, and kills and
restarts servers (Jepsen's lock workloads; etcd's and kazoo's fault harnesses).

Each worker keeps ONE client for the whole run: a client must outlive its sessions,
recovering from every fault by itself. After every fault:

* no lost update among accepted writes, fences increase in acquisition order, and no two
  holders overlap unless one of them got ``LockLost`` (or was killed);
* the paused and the cut-off holders got ``LockLost``;
* every live worker acquires again within TTL + 5 s of the fault ending;
* once every worker has stopped, no waiter key is left.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

import anyio
import pytest

from coord.testing import (
    EtcdCluster,
    EtcdServer,
    TcpProxy,
    ZooKeeperEnsemble,
    ZooKeeperServer,
)
from coord.testing.pytest_plugin import fresh_namespace

from . import _checks
from ._harness import FaultRun

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.timeout(120)]

TTL = 2.0
RECOVERY = TTL + 5  # every live worker acquires again within this, after a fault
WORKERS = 3


@pytest.fixture(params=["mutex", "cohort", "election", "queue"])
def run(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FaultRun]:
    """Workers on a mutex (strict, or in cohort mode: the two tasks of each worker hand
    the lock to each other locally), or campaigning in an election: then the same checks say that
    at most one leader holds each fence, terms are strictly ordered, the deposed leader
    is told (LeadershipLost is a LockLost), and there is a leader again (every worker
    leads in turn) within TTL + 5 s of each fault. Or claiming jobs of one key from a
    queue that a producer process keeps filled: each job is a hold (one at a time, by
    per-key order), the holder that is paused or cut off is told (ClaimLost), and at the
    end no job was lost, none was acked twice, and jobs were acked in put order."""
    run = FaultRun(tmp_path, ttl=TTL, recipe=request.param)
    try:
        yield run
    finally:
        run.close()


def _url(base: str) -> str:
    return f"{base}/{fresh_namespace()}"


async def _start(run: FaultRun, url: str, urls: dict[str, str] | None = None) -> None:
    if run.recipe == "queue":
        run.spawn("producer", url, role="producer")
    for number in range(WORKERS):
        proc = f"p{number}"
        run.spawn(proc, (urls or {}).get(proc, url))
    await run.steady(3)


async def _finish(run: FaultRun, url: str) -> None:
    await run.stop()
    try:
        writes = run.check()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{run.report()}") from None
    assert writes > 0
    await run.check_no_keys_left(url)


async def _told(run: FaultRun, hold: _checks.Hold) -> None:
    await run.until(
        f"{hold.proc} is told that it lost fence {hold.fence}",
        lambda: any(
            e.kind == "LOST" and e.proc == hold.proc and e.fence == hold.fence for e in run.events()
        ),
        RECOVERY,
    )


async def test_holder_paused_past_its_ttl(
    run: FaultRun, server: EtcdServer | ZooKeeperServer
) -> None:
    """SIGSTOP the holder for 2 x TTL (a GC pause, a stalled VM), then SIGCONT: the
    others take over meanwhile; the paused one is told (LockLost), its late write is
    rejected by the fence, and it acquires again, with the same client."""
    url = _url(server.url)
    await _start(run, url)
    hold = await run.wait_for_holder()
    paused = run.workers[hold.proc]
    paused.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    others = [p for p in run.alive() if p != hold.proc]
    await run.everyone_acquires_after(stopped_at, RECOVERY, procs=others)
    await anyio.sleep(max(stopped_at + 2 * TTL - time.monotonic(), 0))
    paused.signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    await run.everyone_acquires_after(resumed_at, RECOVERY)
    await _told(run, hold)
    await _finish(run, url)
    _checks.check_reported_lost(run.holds(), hold.proc, hold.fence)


async def test_holder_killed(run: FaultRun, server: EtcdServer | ZooKeeperServer) -> None:
    """SIGKILL the holder: the others acquire within TTL + 5 s (its lease expires); a
    replacement process, as a supervisor would start, acquires too."""
    url = _url(server.url)
    await _start(run, url)
    hold = await run.wait_for_holder()
    run.kill(hold.proc)
    await run.everyone_acquires_after(time.monotonic(), RECOVERY)
    run.spawn("replacement", url)
    await run.everyone_acquires_after(time.monotonic(), RECOVERY + 5)  # + its start-up
    await _finish(run, url)


@pytest.mark.kills_server
async def test_server_killed_and_restarted(
    run: FaultRun, server: EtcdServer | ZooKeeperServer
) -> None:
    """SIGKILL the server and start it again (same ports, same data): every worker
    acquires again, with the client it already had."""
    url = _url(server.url)
    await _start(run, url)
    await anyio.to_thread.run_sync(lambda: server.restart(kill=True))
    await run.everyone_acquires_after(time.monotonic(), RECOVERY)
    await run.steady(6)
    await _finish(run, url)


@pytest.fixture
def cluster(kind: str) -> Iterator[EtcdCluster | ZooKeeperEnsemble]:
    factory = EtcdCluster if kind == "etcd" else ZooKeeperEnsemble
    with factory(3) as cluster:
        yield cluster


async def test_cluster_leader_killed(
    run: FaultRun, cluster: EtcdCluster | ZooKeeperEnsemble
) -> None:
    """Kill the leader of a 3-member etcd cluster / ZooKeeper ensemble: the others elect
    a new one, and every worker acquires again; the member comes back as a follower.
    The clients cannot beat the election, which may take seconds on a loaded machine:
    the bound runs from the moment a new leader is seen."""
    url = _url(cluster.url)
    await _start(run, url)
    leader = await anyio.to_thread.run_sync(cluster.wait_for_leader)
    await anyio.to_thread.run_sync(lambda: leader.stop(kill=True))
    killed_at = time.monotonic()
    await anyio.to_thread.run_sync(cluster.wait_for_leader)
    election = time.monotonic() - killed_at
    await run.everyone_acquires_after(killed_at, election + RECOVERY)
    await anyio.to_thread.run_sync(leader.start)
    await run.everyone_acquires_after(time.monotonic(), RECOVERY)
    await _finish(run, url)


@pytest.fixture
def proxy(server: EtcdServer | ZooKeeperServer) -> Iterator[TcpProxy]:
    port = server.client_port if isinstance(server, EtcdServer) else server.port
    with TcpProxy(port) as proxy:
        yield proxy


@pytest.fixture
def others(server: EtcdServer | ZooKeeperServer) -> Iterator[list[TcpProxy]]:
    """Proxies that only pass bytes on, for the workers that are not cut off."""
    port = server.client_port if isinstance(server, EtcdServer) else server.port
    with TcpProxy(port) as first, TcpProxy(port) as second:
        yield [first, second]


async def test_client_cut_off_past_its_ttl(
    run: FaultRun,
    server: EtcdServer | ZooKeeperServer,
    proxy: TcpProxy,
    others: list[TcpProxy],
    kind: str,
) -> None:
    """Cut one worker off from the store for 2 x TTL (a partition: nothing gets through,
    no connection is reset), then heal. The others take over; the cut-off holder is
    told; after the heal it acquires again, with the same client.

    Every worker reaches the store through a proxy of its own: the queue hands a job to
    whichever idle worker claims it first, and a worker with the only extra hop lost
    every race for the one key's next job under load (20 s without a claim, twice in
    twelve loops with a CPU hog), which the test would have read as a wedged client."""
    namespace = fresh_namespace()
    url = f"{server.url}/{namespace}"
    scheme = "etcd" if kind == "etcd" else "zk"
    urls = {
        f"p{number}": f"{scheme}://{hop.endpoint}/{namespace}"
        for number, hop in enumerate([proxy, *others])
    }
    await _start(run, url, urls)
    await run.wait_for_holder("p0")
    proxy.blackhole()
    cut_at = time.monotonic()
    await run.everyone_acquires_after(cut_at, RECOVERY, procs=["p1", "p2"])
    await anyio.sleep(max(cut_at + 2 * TTL - time.monotonic(), 0))
    healed_at = time.monotonic()
    proxy.heal()
    await run.everyone_acquires_after(healed_at, RECOVERY)
    # The cut-off holder: p0's last hold before the heal. In strict mode it is the hold
    # of the cut (its release needs the store); in cohort mode that one may still hand
    # the lock to p0's other task, with no round trip, while the lease is valid.
    hold = max(
        (h for h in run.holds() if h.proc == "p0" and h.entered < healed_at),
        key=lambda h: h.entered,
    )
    await _told(run, hold)
    await _finish(run, url)
    _checks.check_reported_lost(run.holds(), hold.proc, hold.fence)


@pytest.mark.parametrize("cut", ["partition", "lost replies"])
async def test_producer_cut_off_past_its_ttl(
    tmp_path: Path, server: EtcdServer | ZooKeeperServer, proxy: TcpProxy, kind: str, cut: str
) -> None:
    """The producer of a queue is cut off from the store for 2 x TTL — a partition, or
    only the store's replies lost (its requests are applied, their answers never come) —
    then healed. A put in flight ends unknown (OutcomeUnknown, or a lost session) and is
    repeated with the same job id: no job is lost, none is queued twice (none acked
    twice, every job worked on was reported put), jobs are still worked on in put order,
    and every worker gets a new job within TTL + 5 s of the heal."""
    run = FaultRun(tmp_path, ttl=TTL, recipe="queue")
    try:
        namespace = fresh_namespace()
        url = f"{server.url}/{namespace}"
        scheme = "etcd" if kind == "etcd" else "zk"
        run.spawn("producer", f"{scheme}://{proxy.endpoint}/{namespace}", role="producer")
        for number in range(WORKERS):
            run.spawn(f"p{number}", url)
        await run.steady(3)
        if cut == "partition":
            proxy.blackhole()
        else:
            proxy.drop(direction="replies")
        await anyio.sleep(2 * TTL)
        healed_at = time.monotonic()
        proxy.heal()
        await run.everyone_acquires_after(healed_at, RECOVERY)
        await _finish(run, url)
    finally:
        run.close()
