"""What an idle lock's acquire costs as deleted waiter keys pile up on etcd.

etcd keeps every deleted key in its index until a compaction, and a range read walks the
deleted keys in its range. coord's waiter keys are new per acquire (etcd #10756) and sort
before the live ones, so a read from a queue's start costs every acquire since the last
compaction. An idle lock's acquire used to make one (inside its registering transaction,
in the store's apply loop) to learn that nobody was ahead; with an idle tail it reads
nothing. This prints, for a growing number of deleted waiter keys under one lock's name:

* coord's uncontended acquire+release of that lock (µs per cycle);
* one read from the queue's start, alone (µs): what every such acquire added before;
* a raw put+delete pair on coord's transport (µs), the yardstick, in the same minutes.

    python benchmarks/etcd_history.py [--deleted 0,10000,50000] [--rounds 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import TYPE_CHECKING

import anyio
from aetcd import rpc

import coord
from coord.backends.etcd._grpc import Channel
from coord.backends.etcd._waitqueue import order_key, queue_range
from coord.testing import EtcdServer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def blocks(fn: Callable[[], Awaitable[None]], rounds: int, block: int = 50) -> float:
    """The median µs per call of *fn* over blocks of *block* calls."""
    times = []
    for _ in range(max(rounds // block, 1)):
        t0 = time.perf_counter()
        for _ in range(block):
            await fn()
        times.append((time.perf_counter() - t0) / block * 1e6)
    return statistics.median(times)


async def main(url: str, host: str, port: int, counts: list[int], rounds: int) -> None:
    channel = await Channel(host, port).__aenter__()  # (its tasks, until __aexit__)
    kv = rpc.KVStub(channel)
    async with coord.connect(url, ttl=30) as client:
        name = f"h{uuid.uuid4().hex[:8]}"
        mutex = client.mutex(name)
        pk = client.backend._key(name + "/")  # type: ignore[attr-defined]
        start, end = queue_range(pk)
        made = 0

        async def cycle() -> None:
            await mutex.acquire()
            await mutex.release()

        async def head_read() -> None:
            request = rpc.RangeRequest(key=start, range_end=end, limit=1, keys_only=True)
            await kv.Range(request, timeout=10)

        async def raw_pair() -> None:
            await kv.Put(rpc.PutRequest(key=b"raw", value=b""), timeout=10)
            await kv.DeleteRange(rpc.DeleteRangeRequest(key=b"raw"), timeout=10)

        await cycle()  # the first makes the idle tail; its number is far above these
        print(f"{'deleted keys':>12}  {'coord cycle':>11}  {'head read':>9}  {'raw pair':>8}")
        for count in counts:
            while made < count:  # waiter-like keys put and deleted, 100 a transaction
                wid = b"@w" + uuid.uuid4().hex.encode()
                keys = [order_key(pk, made + i) + wid for i in range(100)]
                puts = [rpc.RequestOp(request_put=rpc.PutRequest(key=k)) for k in keys]
                await kv.Txn(rpc.TxnRequest(success=puts), timeout=30)
                low, high = order_key(pk, made), order_key(pk, made + 100)
                await kv.DeleteRange(rpc.DeleteRangeRequest(key=low, range_end=high), timeout=30)
                made += 100
            await cycle()
            mine = await blocks(cycle, rounds)
            read = await blocks(head_read, rounds)
            raw = await blocks(raw_pair, rounds)
            print(f"{count:>12,}  {mine:>9.0f}us  {read:>7.0f}us  {raw:>6.0f}us")
    await channel.__aexit__(None, None, None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deleted", default="0,10000,50000")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with EtcdServer() as server:
        host, port = server.endpoint.rsplit(":", 1)
        anyio.run(
            main,
            server.url + "/history",
            host,
            int(port),
            [int(n) for n in args.deleted.split(",")],
            args.rounds,
        )
