"""Queue throughput: puts per second, then claim+ack per second with W workers over C
clients, with jobs spread over K keys, on one store. For comparison in the same run, the
store's raw cost of the same consensus writes: a mutex acquire+release loop of one client
(two writes each, like a put plus an ack), so the ratio says what the queue's extra
reads and its turn mutex cost.

    python benchmarks/queue_bench.py --store etcd --jobs 500 --workers 8
    python benchmarks/queue_bench.py --store zk --jobs 300 --workers 8
"""

from __future__ import annotations

import argparse
import time
from contextlib import AsyncExitStack

import anyio

import coord
from coord.testing import EtcdServer, ZooKeeperServer


async def bench(url: str, jobs: int, workers: int, clients: int, keys: int) -> float:
    """Print the rates; return the claim+acks per second."""
    async with AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(coord.connect(url, ttl=10)) for _ in range(clients)]
        queue = pool[0].queue("bench")
        started = time.monotonic()
        for n in range(jobs):
            await queue.put(b"x" * 100, key=f"k{n % keys}" if keys else None)
        put_took = time.monotonic() - started
        done = 0
        finished = anyio.Event()

        async def worker(client: coord.Client) -> None:
            nonlocal done
            q = client.queue("bench")
            while True:
                async with q.claim():
                    pass
                done += 1
                if done == jobs:
                    finished.set()

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for number in range(workers):
                tg.start_soon(worker, pool[number % clients])
            await finished.wait()
            tg.cancel_scope.cancel()
        claim_took = time.monotonic() - started
        mutex = pool[0].mutex("bench-peer")
        started = time.monotonic()
        for _ in range(jobs):
            async with mutex:
                pass
        peer_took = time.monotonic() - started
    print(
        f"{jobs} jobs, {keys} keys, {workers} workers on {clients} clients: "
        f"put {jobs / put_took:.0f}/s, claim+ack {jobs / claim_took:.0f}/s; "
        f"peer (one client's mutex acquire+release) {jobs / peer_took:.0f}/s; "
        f"claim+ack / peer = {peer_took / claim_took:.2f}"
    )
    return jobs / claim_took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk"], default="etcd")
    parser.add_argument("--url", help="an existing store (default: start a throwaway one)")
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--keys", type=int, default=16)
    args = parser.parse_args()
    if args.url:
        anyio.run(bench, args.url, args.jobs, args.workers, args.clients, args.keys)
        return
    server = EtcdServer() if args.store == "etcd" else ZooKeeperServer()
    with server:
        url = f"{server.url}/bench"
        anyio.run(bench, url, args.jobs, args.workers, args.clients, args.keys)


if __name__ == "__main__":
    main()
