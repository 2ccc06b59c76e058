"""What a deep queue costs: ``queue.run()`` over the first jobs of queues of growing depth.

For each store (a throwaway server, durable as production runs it, as in
``queue_bench.py``) and each depth D, this puts D jobs (untimed), then runs the first
*count* of them with ``queue.run()``, 8 workers over 4 clients, and prints jobs/s, the
store's CPU a job (the server process's CPU time over the run) and the client's CPU a
job (this process: the 4 clients and their workers).

A looker reads the head of its queue (the oldest 256 jobs) about once every 25 jobs. On
etcd a range sorted by creation is read whole before it is sorted and cut, so each such
read costs the store the whole queue; on ZooKeeper a listing returns every child, so it
costs the client the whole queue. Both grow with the depth; this measures by how much.

    python benchmarks/queue_depth.py                         # both stores
    python benchmarks/queue_depth.py --store etcd --depths 2000 20000 --count 2000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _stores import production_server
from queue_bench import CLIENTS, queue_puts, run_first

WORKERS = 8


async def first_jobs(url: str, server: Any, depth: int, count: int) -> tuple[float, float, float]:
    """Put *depth* jobs, then run the first *count* with ``queue.run()``: jobs/s, the
    store's and this process's CPU seconds a job over the run (the clients' connecting
    included)."""
    name = f"d{depth}"
    await queue_puts(url, depth, name, 0)
    cpu, store = time.process_time(), server.cpu_seconds()
    rate = await run_first(url, name, count, WORKERS)
    store_cpu, client_cpu = server.cpu_seconds() - store, time.process_time() - cpu
    return rate, store_cpu / count, client_cpu / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk", "both"], default="both")
    parser.add_argument("--depths", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    if any(depth < args.count for depth in args.depths):
        parser.error("each depth must be at least --count")
    stores = ["etcd", "zk"] if args.store == "both" else [args.store]
    for store in stores:
        server = production_server(store)
        with server:
            for depth in args.depths:
                rate, store_cpu, client_cpu = asyncio.run(
                    first_jobs(f"{server.url}/bench", server, depth, args.count)
                )
                print(
                    f"{store}: depth {depth:,}, run() of the first {args.count:,} jobs, "
                    f"{WORKERS} workers on {CLIENTS} clients: {rate:,.0f}/s; store CPU "
                    f"{store_cpu * 1e6:,.0f} us a job, client CPU {client_cpu * 1e6:,.0f} us a job"
                )


if __name__ == "__main__":
    main()
