"""Scale curves (issue 9): time and client memory per waiter, and per held lock.

Starts a throwaway etcd and ZooKeeper and measures coord's strict Mutex:

* **waiters** — one client holds a mutex while W tasks (over 4 clients) queue on it:
  the time to register them all (per waiter), the client memory each costs (Python heap,
  tracemalloc, in a second pass of the same run so the timing pass is not slowed down),
  then the drain: the time per handoff until the queue is empty;
* **locks** — one task of one client acquires L different mutexes one after the other and
  holds them all: the time per acquire, the memory per held lock, the time per release.

Writes ``benchmarks/scale.md`` and prints it. Compare rows of one run.

    python benchmarks/scale.py                                  # a few minutes
    python benchmarks/scale.py --waiters 10 100 --locks 100 1000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

import anyio

import coord
from coord._hold import GUARD_DELAY
from coord.testing import EtcdServer, ZooKeeperServer, wait_for_waiters

HERE = Path(__file__).parent
TOP = 0  # --heap-top: print the files that hold the most heap at each sample


class Heap:
    """Python heap growth over a block, when tracing (else 0)."""

    def __init__(self, trace: bool) -> None:
        self.trace = trace
        self.grown = 0

    def __enter__(self) -> Heap:
        gc.collect()
        self.before = tracemalloc.get_traced_memory()[0] if self.trace else 0
        return self

    def sample(self) -> None:
        if self.trace:
            gc.collect()
            self.grown = tracemalloc.get_traced_memory()[0] - self.before
            if TOP:
                stats = tracemalloc.take_snapshot().statistics("filename")
                for stat in stats[:TOP]:
                    print(f"    {stat.size / 1024:10.0f} KB  {stat.traceback[0].filename}")

    def __exit__(self, *exc: object) -> None:
        pass


async def waiters(url: str, count: int, trace: bool) -> tuple[float, float, float]:
    """(seconds per registration, heap bytes per waiter, seconds per handoff)."""
    name = f"w{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(coord.connect(url, ttl=60)) for _ in range(4)]
        holder = clients[0].mutex(name)
        await holder.acquire()
        done = 0
        drained = anyio.Event()

        async def waiter(client: coord.Client) -> None:
            nonlocal done
            async with client.mutex(name):
                pass
            done += 1
            if done == count:
                drained.set()

        with Heap(trace) as heap:
            async with anyio.create_task_group() as tg:
                t0 = time.perf_counter()
                for i in range(count):
                    tg.start_soon(waiter, clients[i % len(clients)])
                await wait_for_waiters(clients[0], name, count + 1)
                registered = time.perf_counter() - t0
                await anyio.sleep(GUARD_DELAY + 0.5)  # every waiter has its guard watch
                heap.sample()
                t1 = time.perf_counter()
                await holder.release()
                await drained.wait()
                drain = time.perf_counter() - t1
    return registered / count, heap.grown / count, drain / count


async def locks(url: str, count: int, trace: bool) -> tuple[float, float, float]:
    """(seconds per acquire, heap bytes per held lock, seconds per release)."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    async with coord.connect(url, ttl=60) as client:
        mutexes = [client.mutex(f"{prefix}/{i}") for i in range(count)]
        with Heap(trace) as heap:
            t0 = time.perf_counter()
            for mutex in mutexes:
                await mutex.acquire()
            acquired = time.perf_counter() - t0
            # Every hold has its guard watch by now (or the backlog shows): they start
            # once a hold has existed for GUARD_DELAY.
            await anyio.sleep(GUARD_DELAY + 0.5)
            heap.sample()
            t1 = time.perf_counter()
            for mutex in mutexes:
                await mutex.release()
            released = time.perf_counter() - t1
    return acquired / count, heap.grown / count, released / count


async def measure(store: str, url: str, ws: list[int], ls: list[int]) -> list[list[str]]:
    rows = []
    for kind, sizes, func, first, last in (
        ("waiters on one mutex", ws, waiters, "register", "handoff"),
        ("mutexes held by one client", ls, locks, "acquire", "release"),
    ):
        for n in sizes:
            a, _, b = await func(url, n, False)
            tracemalloc.start()
            try:
                _, memory, _ = await func(url, n, True)
            finally:
                tracemalloc.stop()
            rows.append(
                [
                    store,
                    kind,
                    f"{n:,}",
                    f"{first} {a * 1000:.2f} ms",
                    f"{b * 1000:.2f} ms",
                    f"{memory / 1024:.1f} KB",
                ]
            )
            print(" | ".join(rows[-1]), f"({last})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--locks", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--heap-top", type=int, default=0, metavar="N")
    args = parser.parse_args()
    global TOP
    TOP = args.heap_top
    rows: list[list[str]] = []
    with EtcdServer() as etcd:
        rows += anyio.run(measure, "etcd", etcd.url + "/scale", args.waiters, args.locks)
    with ZooKeeperServer() as zk:
        rows += anyio.run(measure, "ZooKeeper", zk.url + "/scale", args.waiters, args.locks)
    header = ["store", "case", "n", "time per item", "then per item", "client heap per item"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    command = "python benchmarks/scale.py " + " ".join(sys.argv[1:])
    text = "\n".join(lines)
    note = "(waiters: register, then handoff while draining; mutexes: acquire, then release)"
    (HERE / "scale.md").write_text(f"`{command.strip()}` {note}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
