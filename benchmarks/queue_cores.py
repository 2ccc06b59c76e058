"""Where the cores go in ``queue.run()``: its 4 clients in one process, and in 4.

``queue_bench.py`` runs the queue's 4 clients in its own process, beside the floor's raw
client (grpc's C core, whose work runs on threads of its own). This measures what that
shape costs on this machine. For each W (8 and 32 workers over 4 clients) and each
round, between two floors of the same W, it runs the first *jobs* jobs of a fresh queue:

* **one process**: ``queue_bench.run_first`` (the 4 clients in this process);
* **4 processes**: each client in a process of its own, ``queue.run()`` with W/4 workers,
  the jobs counted across them (the clock runs from the go to the last job's handler);

and prints jobs/s, the ratio to the mean of the two floors, and how busy the machine was
meanwhile (``/proc/stat``, of 100% per core; time waiting for I/O counts as idle).

    python benchmarks/queue_cores.py --store etcd --jobs 3000 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import TYPE_CHECKING, Any

from _stores import production_server
from queue_bench import CLIENTS, WORKERS, floor, queue_puts, run_first

import coord

if TYPE_CHECKING:
    from collections.abc import Awaitable


def _times() -> tuple[int, int]:
    """The machine's CPU time so far, all and idle (idle and waiting for I/O), in ticks."""
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


async def busy(measure: Awaitable[float]) -> tuple[float, float]:
    """``await measure`` (jobs/s), and the machine's busy share meanwhile (%)."""
    all0, idle0 = _times()
    rate = await measure
    all1, idle1 = _times()
    cores = os.cpu_count() or 1
    return rate, (1 - (idle1 - idle0) / max(all1 - all0, 1)) * 100 * cores


def _client(
    url: str, name: str, workers: int, jobs: int, done: Any, events: tuple[Any, ...]
) -> None:
    """One client's process: ``queue.run()`` with *workers* workers from *go* to *stop*;
    *finished* once *done* (shared by the processes) counts *jobs*."""
    ready, go, finished, stop = events

    async def main() -> None:
        async with coord.connect(url, ttl=10) as client:

            async def handler(job: coord.Job) -> None:
                with done.get_lock():
                    done.value += 1
                    if done.value == jobs:
                        finished.set()

            ready.set()
            await asyncio.to_thread(go.wait)
            run = asyncio.create_task(
                client.queue(name).run(handler, concurrency=workers, signals=())
            )
            await asyncio.to_thread(stop.wait)
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    asyncio.run(main())


async def run_in_processes(url: str, name: str, jobs: int, workers: int) -> float:
    """The first *jobs* jobs of *name* by *workers* workers over CLIENTS processes: jobs/s."""
    spawn = multiprocessing.get_context("spawn")
    done, go, finished, stop = spawn.Value("i", 0), spawn.Event(), spawn.Event(), spawn.Event()
    readies = [spawn.Event() for _ in range(CLIENTS)]
    processes = [
        spawn.Process(
            target=_client,
            args=(url, name, workers // CLIENTS, jobs, done, (ready, go, finished, stop)),
        )
        for ready in readies
    ]
    for process in processes:
        process.start()
    try:
        for ready in readies:
            await asyncio.to_thread(ready.wait)
        started = time.perf_counter()
        go.set()
        await asyncio.to_thread(finished.wait)
        return jobs / (time.perf_counter() - started)
    finally:
        stop.set()
        for process in processes:
            await asyncio.to_thread(process.join)


async def run(store: str, jobs: int, rounds: int) -> None:
    server = production_server(store)
    with server:
        url = server.url
        for workers in WORKERS:
            for n in range(rounds):
                tag = f"c{workers}r{n}"
                before = await floor(store, server, jobs, workers, f"{tag}a")
                await queue_puts(url, jobs, f"{tag}p", 0)
                apart, apart_busy = await busy(run_in_processes(url, f"{tag}p", jobs, workers))
                await queue_puts(url, jobs, f"{tag}o", 0)
                one, one_busy = await busy(run_first(url, f"{tag}o", jobs, workers))
                after = await floor(store, server, jobs, workers, f"{tag}b")
                mean = (before + after) / 2
                print(
                    f"{store}: {workers} workers, round {n + 1}: floor {mean:,.0f}/s; "
                    f"one process {one:,.0f}/s ({one / mean:.2f}, machine {one_busy:.0f}% "
                    f"busy); {CLIENTS} processes {apart:,.0f}/s ({apart / mean:.2f}, "
                    f"machine {apart_busy:.0f}% busy)",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("etcd", "zk"), default="etcd")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.store, args.jobs, args.rounds))


if __name__ == "__main__":
    main()
