"""A partitioner worker of the fault suite: one process, ONE client for its whole life, a
member of one partitioner that works every partition it owns::

    async with owner.partition(p) as hold:
        OWN; every 0.3 s: PWRITE with hold.fence; DROP (inside the block, as it ends)

reporting each step to the fenced store (``_store.py``), whose writes are fenced per
partition. A lost membership (MembershipLost) is reported as MLOST and the worker joins
again, with the same client; any other exception as ERROR. SIGTERM closes the client
(leaving the group) and exits 0.

    python _partition_worker.py --url etcd://... --store 127.0.0.1:PORT --proc p0 --ttl 2 \
        [--partitions 64]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import anyio

import coord
from tests.faults._worker import StoreClient, connect_store

NAME = "faults/partitions"
PARTITIONS = 64
WRITE_EVERY = 0.3


class Reporter:
    """The store connection, shared by the tasks of this process (one request at a time)."""

    def __init__(self, store: StoreClient) -> None:
        self._store = store
        self._lock = anyio.Lock()

    async def ask(self, *words: object) -> str:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                answer: str = await self._store.ask(*words)
        return answer


async def own(owner: coord.Owner, partition: int, store: Reporter, proc: str) -> None:
    try:
        async with owner.partition(partition) as hold:
            try:
                await store.ask("OWN", proc, partition, hold.fence)
                while True:
                    await store.ask("PWRITE", proc, partition, hold.fence)
                    await anyio.sleep(WRITE_EVERY)
            finally:  # still inside the block: before the partition is released
                why = "lost" if hold.lost else "ended"
                await store.ask("DROP", proc, partition, hold.fence, why)
    except coord.PartitionLost:
        pass  # reported above


async def member(client: coord.Client, store: Reporter, proc: str, partitions: int) -> None:
    partitioner = client.partitioner(NAME, partitions=partitions)
    while True:
        try:
            async with partitioner.join(proc.encode()) as owner:
                running: dict[int, int] = {}
                async with anyio.create_task_group() as tg:
                    async for assignment in owner.assignments():
                        for partition, fence in assignment.fences.items():
                            if running.get(partition) != fence:
                                running[partition] = fence
                                tg.start_soon(own, owner, partition, store, proc)
        except coord.MembershipLost as exc:
            await store.ask("ERROR", proc, "member", "MLOST", str(exc)[:150].replace("\n", " "))
        except Exception as exc:  # a service joins again
            await store.ask("ERROR", proc, "member", type(exc).__name__, str(exc)[:150])
        await anyio.sleep(0.3)


async def main(args: argparse.Namespace) -> None:
    hello = await connect_store(args.store)
    await hello.ask("HELLO", args.proc, os.getpid())
    store = Reporter(await connect_store(args.store))
    async with coord.connect(args.url, ttl=args.ttl) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(member, client, store, args.proc, args.partitions)
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--proc", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    anyio.run(main, parser.parse_args(), backend="asyncio")
    sys.exit(0)
