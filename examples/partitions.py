"""Four worker processes share 16 partitions; one is killed; the others take its share.

Each worker runs ``partitioner.run(work)``: a task per partition it owns, printing the
partition and its fence when it starts and when it stops. This script starts the workers,
waits until the 16 partitions are shared 4/4/4/4, SIGKILLs one worker (no chance to
leave: its session must expire on the store), and measures how long until the three
others own all 16 again (5 or 6 each). It checks that only the dead worker's partitions
moved, and that each of them came back with a higher fence. With ``ttl=2`` that takes
about two seconds.

    python examples/partitions.py                      # a throwaway local etcd, started here
    python examples/partitions.py etcd://10.0.0.1:2379/demo
    python examples/partitions.py zk://127.0.0.1:2181/demo
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

import anyio

import coord

if TYPE_CHECKING:
    from anyio.abc import ObjectReceiveStream, Process

WORKERS = 4
PARTITIONS = 16
TTL = 2.0


async def worker(url: str, name: str) -> None:
    async def work(hold: coord.PartitionHold) -> None:
        print(f"{name} owns {hold.partition} fence {hold.fence}", flush=True)
        try:
            await anyio.sleep_forever()  # the partition's jobs, written with hold.fence
        finally:
            print(f"{name} stops {hold.partition} fence {hold.fence}", flush=True)

    async with coord.connect(url, ttl=TTL) as client:
        partitioner = client.partitioner("demo/partitions", partitions=PARTITIONS)
        await partitioner.run(work, name.encode(), cooldown=0.5)


class Ownership:
    """Who owns which partition, from the workers' lines."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}
        self.fence: dict[int, int] = {}

    def read(self, line: str) -> None:
        # (Lines of different workers come through different pipes: a new owner's line
        # may be read before its predecessor's "stops". The fences tell the order.)
        words = line.split()
        if len(words) != 5 or words[1] not in ("owns", "stops"):
            return
        name, partition, fence = words[0], int(words[2]), int(words[4])
        if words[1] == "owns":
            if fence <= self.fence.get(partition, 0):
                raise SystemExit(f"partition {partition}'s fence did not increase: {line}")
            self.owner[partition], self.fence[partition] = name, fence
        elif (self.owner.get(partition), self.fence.get(partition)) == (name, fence):
            del self.owner[partition]

    def shares(self) -> dict[str, set[int]]:
        shares: dict[str, set[int]] = {}
        for partition, owner in self.owner.items():
            shares.setdefault(owner, set()).add(partition)
        return shares

    def balanced(self, members: int) -> bool:
        share = PARTITIONS // members
        counts = [len(mine) for mine in self.shares().values()]
        return (
            len(self.owner) == PARTITIONS
            and len(counts) == members
            and all(share <= c <= share + 1 for c in counts)
        )


async def watch_and_kill(receive: ObjectReceiveStream[str], processes: dict[str, Process]) -> None:
    ownership = Ownership()
    async for line in receive:
        print(line)
        ownership.read(line)
        if ownership.balanced(WORKERS):
            break
    before = ownership.shares()
    print("shares:", {name: sorted(mine) for name, mine in sorted(before.items())})
    victim = min(before)
    processes[victim].send_signal(signal.SIGKILL)
    killed_at = anyio.current_time()
    print(f"-- SIGKILL {victim} (pid {processes[victim].pid}), owner of {sorted(before[victim])}")
    for partition in before[victim]:
        del ownership.owner[partition]  # it will not say so
    async for line in receive:
        print(line)
        ownership.read(line)
        if ownership.balanced(WORKERS - 1):
            break
    took = anyio.current_time() - killed_at
    after = ownership.shares()
    moved = sorted(p for name, mine in after.items() for p in mine - before.get(name, set()))
    print("shares:", {name: sorted(mine) for name, mine in sorted(after.items())})
    print(
        f"rebalanced in {took:.1f} s (ttl {TTL:g} s): {len(moved)} partitions moved {moved}, "
        f"the dead worker's {len(before[victim])}"
    )
    if moved != sorted(before[victim]):
        raise SystemExit("partitions other than the dead worker's moved")
    if took > TTL + 5:
        raise SystemExit(f"the rebalance took {took:.1f} s, longer than the TTL + 5 s")


async def main(url: str) -> None:
    sys.path.insert(0, os.path.dirname(__file__))
    from leader import run_workers

    await run_workers(__file__, url, WORKERS, watch_and_kill, within=40)


def run_worker(url: str, name: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    anyio.run(worker, url, name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        run_worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.path.insert(0, os.path.dirname(__file__))
    from mutex_demo import store_url

    with store_url(sys.argv) as store:
        anyio.run(main, store)
