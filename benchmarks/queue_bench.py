"""Queue throughput against the store's floor, in one run per store.

For each store (a throwaway server, run as production runs it: etcd's default fsync,
ZooKeeper with ``forceSync=yes`` on the JVM's defaults), this prints:

* **puts/s**: *jobs* puts from 8 putter tasks of one client;
* **floor**: the same writes as one job's claim and ack, made by the raw client library
  with the same number of tasks in flight over 4 connections — a compare-and-put of the
  job (the claim, guarded by the job's version) and a delete (the ack), nothing else: no
  reads, no claim entry, no ordering. etcd: aetcd's gRPC stubs on grpc.aio; ZooKeeper:
  kazoo's async calls (``set_async`` with a version, ``delete_async``);
* **the queue**: claim+ack/s of coord's queue with W workers over 4 clients, without
  keys and with jobs spread over 16 keys (per-key order: a key's next job waits for the
  ack of the previous one): with ``queue.run()``, the worker loop, whose worker acks a
  job and claims its next one in one transaction, and with ``async with queue.claim()``
  in a loop (a claim, then an ack: two transactions a job);
* on ZooKeeper, **kazoo's LockingQueue** with 8 worker threads over 4 clients (its
  ``get`` then ``consume``).

Ratios: queue / floor at the same W, and run() at 32 workers / at 8. Each is the median
of ``--rounds`` rounds (3), with the rounds' range beside it. On a shared VM the
machine's speed drifts by tens of percent within minutes (the etcd floor at 8 workers
went from 1,455 to 2,333/s in one half hour), so a single floor measured minutes before
the queue measured the drift as much as the queue: each queue run is measured between
two floors, against their mean, and run() at 32 workers between two runs at 8, against
theirs (back to back, apart from the other measurements). A first round (``--warmup``)
is run and thrown away: a JVM fresh from its start spends up to four times the CPU on
the queue's requests that it does once warm.

    python benchmarks/queue_bench.py                     # both stores
    python benchmarks/queue_bench.py --store etcd --jobs 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import grpc
from _stores import production_server
from aetcd import rpc
from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue

import coord

CLIENTS = int(__import__("os").environ.get("QB_CLIENTS", "4"))
PUTTERS = 8
WORKERS = (8, 32)
KEYS = 16
PAYLOAD = b"x" * 100


# -- coord's queue ------------------------------------------------------------------------


async def queue_puts(url: str, jobs: int, name: str, keys: int) -> float:
    """*jobs* puts from PUTTERS tasks of one client: puts per second."""
    async with coord.connect(url, ttl=10) as client:
        queue = client.queue(name)
        numbers = iter(range(jobs))

        async def putter() -> None:
            for n in numbers:
                await queue.put(PAYLOAD, key=f"k{n % keys}" if keys else None)

        started = time.perf_counter()
        await asyncio.gather(*(putter() for _ in range(PUTTERS)))
        return jobs / (time.perf_counter() - started)


async def queue_claims(url: str, jobs: int, workers: int, keys: int, tag: str = "") -> float:
    """Put *jobs* (untimed), then claim+ack them with *workers* over CLIENTS clients."""
    name = f"q{workers}k{keys}{tag}"
    await queue_puts(url, jobs, name, keys)
    async with AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(coord.connect(url, ttl=10)) for _ in range(CLIENTS)]
        done = 0
        finished = asyncio.Event()

        async def worker(client: coord.Client) -> None:
            nonlocal done
            queue = client.queue(name)
            while True:
                async with queue.claim():
                    pass
                done += 1
                if done >= jobs:
                    finished.set()

        started = time.perf_counter()
        tasks = [asyncio.create_task(worker(pool[n % CLIENTS])) for n in range(workers)]
        await finished.wait()
        took = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return jobs / took


async def queue_run(url: str, jobs: int, workers: int, keys: int, tag: str = "") -> float:
    """Put *jobs* (untimed), then run them with ``queue.run()``: *workers* over CLIENTS
    clients (``concurrency=workers // CLIENTS`` each), whose worker acks a job and claims
    its next one in one transaction."""
    name = f"r{workers}k{keys}{tag}"
    await queue_puts(url, jobs, name, keys)
    return await run_first(url, name, jobs, workers)


async def run_first(url: str, name: str, jobs: int, workers: int) -> float:
    """Run the first *jobs* of the queue *name* with ``queue.run()``, *workers* over
    CLIENTS clients: jobs per second."""
    async with AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(coord.connect(url, ttl=10)) for _ in range(CLIENTS)]
        done = 0
        finished = asyncio.Event()

        async def handler(job: coord.Job) -> None:
            nonlocal done
            done += 1
            if done >= jobs:
                finished.set()

        started = time.perf_counter()
        tasks = [
            asyncio.create_task(
                client.queue(name).run(handler, concurrency=workers // CLIENTS, signals=())
            )
            for client in pool
        ]
        await finished.wait()
        took = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return jobs / took


# -- the floor: etcd ----------------------------------------------------------------------


async def etcd_floor(endpoint: str, jobs: int, workers: int, tag: str = "") -> float:
    channels = [grpc.aio.insecure_channel(endpoint) for _ in range(CLIENTS)]
    stubs = [rpc.KVStub(channel) for channel in channels]
    keys = [f"floor{workers}{tag}/{n:08d}".encode() for n in range(jobs)]
    sem = asyncio.Semaphore(64)

    async def put(n: int) -> None:
        async with sem:
            await stubs[n % CLIENTS].Put(rpc.PutRequest(key=keys[n], value=PAYLOAD))

    await asyncio.gather(*(put(n) for n in range(jobs)))
    todo = iter(range(jobs))

    async def worker(stub: Any) -> None:
        for n in todo:
            key = keys[n]
            compare = rpc.Compare(
                key=key,
                result=rpc.Compare.CompareResult.EQUAL,
                target=rpc.Compare.CompareTarget.VERSION,
                version=1,
            )
            claim = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=PAYLOAD + b"c"))
            reply = await stub.Txn(rpc.TxnRequest(compare=[compare], success=[claim]))
            assert reply.succeeded
            await stub.DeleteRange(rpc.DeleteRangeRequest(key=key))

    started = time.perf_counter()
    await asyncio.gather(*(worker(stubs[n % CLIENTS]) for n in range(workers)))
    took = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return jobs / took


# -- the floor and the peer: ZooKeeper ----------------------------------------------------


def _kazoo(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    return client


async def _done(result: Any) -> Any:
    """Await one of kazoo's async results (it completes on kazoo's callback thread)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle() -> None:
        if not future.done():
            future.set_result(None)

    def ready(_: Any) -> None:
        loop.call_soon_threadsafe(settle)

    result.rawlink(ready)
    await future
    return result.get()


async def zk_floor(hosts: str, jobs: int, workers: int, tag: str = "") -> float:
    clients = [_kazoo(hosts) for _ in range(CLIENTS)]
    try:
        base = f"/floor{workers}{tag}"
        clients[0].ensure_path(base)
        sem = asyncio.Semaphore(64)

        async def put(n: int) -> str:
            async with sem:
                return str(
                    await _done(
                        clients[n % CLIENTS].create_async(f"{base}/j-", PAYLOAD, sequence=True)
                    )
                )

        paths = await asyncio.gather(*(put(n) for n in range(jobs)))
        todo = iter(paths)

        async def worker(client: KazooClient) -> None:
            for path in todo:
                await _done(client.set_async(path, PAYLOAD + b"c", version=0))
                await _done(client.delete_async(path, version=1))

        started = time.perf_counter()
        await asyncio.gather(*(worker(clients[n % CLIENTS]) for n in range(workers)))
        return jobs / (time.perf_counter() - started)
    finally:
        for client in clients:
            client.stop()
            client.close()


def kazoo_locking_queue(hosts: str, jobs: int, workers: int, tag: str = "") -> float:
    """kazoo's LockingQueue: *jobs* put (untimed), then get+consume by *workers* threads
    over CLIENTS clients."""
    clients = [_kazoo(hosts) for _ in range(CLIENTS)]
    path = f"/kazoo-queue{tag}"
    try:
        LockingQueue(clients[0], path).put_all([PAYLOAD] * jobs)
        # One LockingQueue per thread: it keeps the element it holds.
        queues = [LockingQueue(clients[n % CLIENTS], path) for n in range(workers)]
        lock = threading.Lock()
        done = [0]

        def worker(queue: LockingQueue) -> None:
            while True:
                with lock:
                    if done[0] >= jobs:
                        return
                    done[0] += 1
                if queue.get(timeout=30) is None:
                    return
                queue.consume()

        threads = [threading.Thread(target=worker, args=(queue,)) for queue in queues]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return jobs / (time.perf_counter() - started)
    finally:
        for client in clients:
            client.stop()
            client.close()


# -- the run ------------------------------------------------------------------------------


HOWS = (("run()", queue_run), ("claim() loop", queue_claims))


async def floor(store: str, server: Any, jobs: int, workers: int, tag: str) -> float:
    """The floor of *store* at *workers* (its keys named by *tag*)."""
    if store == "etcd":
        return await etcd_floor(server.endpoint, jobs, workers, tag)
    return await zk_floor(server.endpoint, jobs, workers, tag)


@dataclass
class Results:
    """What the measured rounds found (a warm-up round's are thrown away)."""

    puts: list[float] = field(default_factory=list)
    floors: dict[int, list[float]] = field(default_factory=lambda: {w: [] for w in WORKERS})
    rates: dict[tuple[str, int, int], list[float]] = field(default_factory=dict)
    ratios: dict[tuple[str, int, int], list[float]] = field(default_factory=dict)
    # run() at 32 workers / at 8, by round
    scaling: dict[int, list[float]] = field(default_factory=lambda: {0: [], KEYS: []})
    peers: list[float] = field(default_factory=list)  # kazoo's LockingQueue, by round


async def one_round(store: str, server: Any, jobs: int, tag: str, results: Results) -> None:
    """One round: the puts, then for each W each way of the queue between two floors,
    then run() at 32 workers between two at 8 (and kazoo's LockingQueue on ZooKeeper)."""
    url = f"{server.url}/bench"
    results.puts.append(await queue_puts(url, jobs * 2, f"puts{tag}", KEYS))
    for workers in WORKERS:
        runs = itertools.count(1)
        # Each queue run between two floors, against their mean: the drift of the
        # machine's speed over a run cancels, to the first order.
        before = await floor(store, server, jobs, workers, f"{tag}f{next(runs)}")
        results.floors[workers].append(before)
        for keys in (0, KEYS):
            for how, measure in HOWS:
                rate = await measure(url, jobs, workers, keys, tag)
                after = await floor(store, server, jobs, workers, f"{tag}f{next(runs)}")
                results.floors[workers].append(after)
                results.rates.setdefault((how, workers, keys), []).append(rate)
                results.ratios.setdefault((how, workers, keys), []).append(
                    rate / ((before + after) / 2)
                )
                before = after
    for keys in (0, KEYS):
        # run() at 32 workers between two runs at 8, back to back (the runs above
        # are minutes apart: their ratio measured the drift as much as the queue).
        low, high = WORKERS
        first = await queue_run(url, jobs, low, keys, f"{tag}s1")
        more = await queue_run(url, jobs, high, keys, f"{tag}s")
        second = await queue_run(url, jobs, low, keys, f"{tag}s2")
        results.scaling[keys].append(more / ((first + second) / 2))
    if store == "zk":
        results.peers.append(
            await asyncio.to_thread(kazoo_locking_queue, server.endpoint, jobs // 2, 8, tag)
        )


async def run_store(store: str, server: Any, jobs: int, rounds: int, warmup: int) -> None:
    """*warmup* rounds thrown away, then *rounds* rounds measured (:func:`one_round`):
    each rate is the median of the rounds (a floor's, of all its runs), and each ratio
    the median of the rounds' own ratios (a queue run against the mean of the floors
    around it). The machine's speed drifts by tens of percent within minutes on a shared
    VM; a ratio of two runs made minutes apart measures that drift as much as the queue.

    The warm-up is the servers': a ZooKeeper fresh from its start spends up to four
    times the CPU a job on the requests its JVM has not yet run many of (the queue's
    multis, watches and listings): `run()` at 8 workers, 3,000 jobs a round, 2.2-2.7 ms
    of its CPU a job in the first round, 1.4-1.8 in the second, 0.5-0.7 from the third
    on. A production ensemble has served them for days."""
    for n in range(warmup):
        await one_round(store, server, jobs, f"-w{n}", Results())
    results = Results()
    for n in range(rounds):
        await one_round(store, server, jobs, f"-{n}", results)
    puts, floors, rates, ratios = results.puts, results.floors, results.rates, results.ratios
    scaling, peers = results.scaling, results.peers
    each = f" (median of {rounds} rounds)" if rounds > 1 else ""
    print(f"{store}: puts {median(puts):,.0f}/s{each} ({jobs * 2} jobs from {PUTTERS} putters)")
    for workers in WORKERS:
        print(
            f"{store}: {workers} workers on {CLIENTS} clients: floor "
            f"{median(floors[workers]):,.0f}/s{each}"
        )
        for keys in (0, KEYS):
            what = f"{keys} keys" if keys else "no keys"
            line = [
                f"{how} {median(rates[how, workers, keys]):,.0f}/s = "
                f"{median(ratios[how, workers, keys]):.2f} of the floor"
                f"{_spread(ratios[how, workers, keys])}"
                for how, _ in HOWS
            ]
            print(f"{store}:   {what}: " + "; ".join(line))
    for keys in (0, KEYS):
        what = f"{keys} keys" if keys else "no keys"
        print(
            f"{store}: run() ({what}) at {WORKERS[1]} workers / at {WORKERS[0]}: "
            f"{median(scaling[keys]):.2f}{_spread(scaling[keys])}"
        )
    if store == "zk":
        against = [ours / peer for ours, peer in zip(rates["run()", 8, 0], peers, strict=True)]
        print(
            f"zk: kazoo LockingQueue, 8 worker threads on {CLIENTS} clients: "
            f"{median(peers):,.0f}/s{each}; coord's queue (no keys, 8 workers, run()) / "
            f"kazoo: {median(against):.1f}{_spread(against)}"
        )


def _spread(values: list[float]) -> str:
    """The rounds' values, when there are several: `` (rounds 0.61-0.74)``."""
    if len(values) < 2:
        return ""
    return f" (rounds {min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["etcd", "zk", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per store (medians are printed)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="rounds per store run first and thrown away (the servers' warm-up)",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    stores = ["etcd", "zk"] if args.store == "both" else [args.store]
    for store in stores:
        server = production_server(store)
        with server:
            asyncio.run(run_store(store, server, args.jobs, args.rounds, args.warmup))


if __name__ == "__main__":
    main()
