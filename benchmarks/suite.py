"""The benchmark suite: one command for the table and the plot (issue 9).

Starts a throwaway etcd and ZooKeeper and measures, in one run per store:

* **floor** — the physical floor of one handoff through the network with the raw client
  library: a chain of waiters, each already watching the key of the one before; the
  holder deletes its key, the next gets the event and confirms with one read, then
  deletes its own (raw aetcd / raw kazoo);
* **coord.Mutex** (strict FIFO), **coord cohort** (``local_handoff=k``: a client's
  tasks hand the lock on locally; k = 16 and 64 by default), the store's usual
  Python lock (aetcd.Lock, kazoo.Lock) and **tooz** (OpenStack's coordination library,
  the lock a Python user would pick instead: its etcd3gw driver, HTTP/JSON to etcd's
  grpc-gateway, and its zookeeper driver, kazoo's lock underneath) with N = 1, 8, 32, 128
  contenders spread over min(N, 8) clients, each looping acquire/release:
  acquisitions/s, p50/p99 wait, max/mean wait (fairness), the server's messages per
  acquisition (etcd ``grpc_server_msg_sent_total`` for Watch; ZooKeeper watch
  notifications), the requests the server received per acquisition (etcd
  ``grpc_server_msg_received_total``, every method; ZooKeeper ``zk_packets_received``),
  and this process's CPU time per acquisition;
* **uncontended** acquire+release of one client against two raw round trips of the same
  client library (create + delete).

Writes ``benchmarks/results.md`` (the table) and ``benchmarks/results.png`` (acquisitions
per second against contenders, with the floor), and prints the table.

tooz is synchronous: its contenders are threads (as kazoo.Lock's), one tooz coordinator
per client, started with its heartbeat thread (``start(start_heart=True)``) as its docs
say. Its etcd lock has no queue and no wake-up: each attempt grants a new lease and tries
a compare-and-put; a failed attempt sleeps (tenacity, exponential back-off capped at 1 s)
and tries again, and the leases of failed attempts are left to expire. Compare rows of one
run: this machine's absolute numbers move by up to 2x from run to run.

    python benchmarks/suite.py                  # about 6 minutes
    python benchmarks/suite.py --seconds 2 --contenders 1 8
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import anyio
from _stores import production_server
from aetcd import rpc
from kazoo.client import KazooClient

import coord
from coord.backends.etcd._grpc import Channel

sys.path.insert(0, str(Path(__file__).parent))
import anyio.lowlevel
import tooz_peer
from mutex_bench import notifications, requests_received

HERE = Path(__file__).parent


@dataclass
class Row:
    store: str
    lock: str
    contenders: int
    rate: float
    waits: list[float] = field(default_factory=list)
    msgs: float = 0.0
    cpu_ms: float = 0.0
    requests: float = 0.0

    def cells(self) -> list[str]:
        if not self.waits:
            return [self.store, self.lock, str(self.contenders), f"{self.rate:,.0f}"] + ["-"] * 6
        waits = sorted(self.waits)
        p50 = waits[len(waits) // 2] * 1000
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000
        mean = statistics.mean(waits)
        fairness = max(waits) / mean if mean else 0.0
        return [
            self.store,
            self.lock,
            str(self.contenders),
            f"{self.rate:,.0f}",
            f"{p50:.1f} ms",
            f"{p99:.1f} ms",
            f"{fairness:.2f}",
            f"{self.msgs:.1f}",
            f"{self.requests:.1f}",
            f"{self.cpu_ms:.2f}",
        ]


HEADER = [
    "store",
    "lock",
    "contenders",
    "acq/s",
    "p50 wait",
    "p99 wait",
    "max/mean",
    "server msgs/acq",
    "server requests/acq",
    "client CPU ms/acq",
]


# -- contenders sharing clients ------------------------------------------------------------


async def loop(acquire: Any, release: Any, deadline: float, waits: list[float]) -> None:
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        await acquire()
        waits.append(time.perf_counter() - t0)
        await release()


#: Cohort mode's local handoffs in a row, as benchmarked by default (--cohort-k).
COHORT_K = [16, 64]


async def coord_run(
    url: str, n: int, deadline: float, waits: list[float], local_handoff: int | None = None
) -> None:
    name = f"b{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(coord.connect(url, ttl=10)) for _ in range(min(n, 8))
        ]
        async with anyio.create_task_group() as tg:
            for i in range(n):
                mutex = clients[i % len(clients)].mutex(name, local_handoff=local_handoff)
                tg.start_soon(loop, mutex.acquire, mutex.release, deadline, waits)


async def aetcd_run(host: str, port: int, n: int, deadline: float, waits: list[float]) -> None:
    key = f"b{uuid.uuid4().hex[:8]}".encode()
    clients = [aetcd.Client(host=host, port=port) for _ in range(min(n, 8))]
    for client in clients:
        await client.connect()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(n):
                lock = clients[i % len(clients)].lock(key, ttl=10)

                async def acquire(lock: Any = lock) -> None:
                    await lock.acquire(timeout=None)

                tg.start_soon(loop, acquire, lock.release, deadline, waits)
    finally:
        for client in clients:
            await client.close()


def threads_run(locks: list[Any], deadline: float, waits: list[float]) -> None:
    """A thread per lock object of a synchronous library, each looping acquire/release."""

    def contend(lock: Any) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            lock.acquire(blocking=True)
            waits.append(time.perf_counter() - t0)
            lock.release()

    threads = [threading.Thread(target=contend, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def kazoo_run_sync(hosts: str, n: int, deadline: float, waits: list[float]) -> None:
    path = f"/bench/b{uuid.uuid4().hex[:8]}"
    clients = [KazooClient(hosts=hosts, timeout=10) for _ in range(min(n, 8))]
    for client in clients:
        client.start()
    try:
        threads_run([clients[i % len(clients)].Lock(path) for i in range(n)], deadline, waits)
    finally:
        for client in clients:
            client.stop()
            client.close()


def tooz_run_sync(url: str, n: int, deadline: float, waits: list[float]) -> None:
    name = f"b{uuid.uuid4().hex[:8]}".encode()
    clients = tooz_peer.coordinators(url, min(n, 8))
    try:
        threads_run([clients[i % len(clients)].get_lock(name) for i in range(n)], deadline, waits)
    finally:
        tooz_peer.stop(clients)


# -- the floor: a chain of raw handoffs ------------------------------------------------------


async def etcd_floor(host: str, port: int, handoffs: int) -> float:
    """Seconds per handoff: delete, watch event, one confirming read (raw aetcd)."""
    async with aetcd.Client(host=host, port=port) as a, aetcd.Client(host=host, port=port) as b:
        prefix = f"floor-{uuid.uuid4().hex[:6]}/".encode()
        total = 0.0
        for i in range(handoffs):
            key = prefix + b"%d" % i
            await a.put(key, b"")
            events = await b.watch(key)
            deleted = anyio.Event()

            async def waiter(events: Any = events, deleted: anyio.Event = deleted) -> None:
                async for event in events:
                    if event.kind == aetcd.EventKind.DELETE:
                        await b.get(prefix)  # the confirming read
                        deleted.set()
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                await anyio.lowlevel.checkpoint()  # (the watch is created: b.watch returned)
                t0 = time.perf_counter()
                await a.delete(key)
                await deleted.wait()
                total += time.perf_counter() - t0
            await events.cancel()
        return total / handoffs


def zk_floor_sync(hosts: str, handoffs: int) -> float:
    """Seconds per handoff: delete, watch event, one confirming read (raw kazoo)."""
    a, b = KazooClient(hosts=hosts), KazooClient(hosts=hosts)
    a.start()
    b.start()
    try:
        base = f"/floor-{uuid.uuid4().hex[:6]}"
        a.ensure_path(base)
        total = 0.0
        for i in range(handoffs):
            path = f"{base}/{i}"
            a.create(path, ephemeral=True)
            done = threading.Event()

            def watch(event: Any, done: threading.Event = done) -> None:
                b.get_children_async(base).get()  # the confirming read (off the callback)
                done.set()

            def on_event(event: Any, watch: Any = watch) -> None:
                threading.Thread(target=watch, args=(event,)).start()

            b.get(path, watch=on_event)
            t0 = time.perf_counter()
            a.delete(path)
            done.wait(10)
            total += time.perf_counter() - t0
        return total / handoffs
    finally:
        for client in (a, b):
            client.stop()
            client.close()


# -- uncontended ---------------------------------------------------------------------------


#: Uncontended rounds: blocks of each, alternating, after a warm-up (the machines are
#: noisy: one block of each, one after the other, gave ratios from 1.2 to 1.9).
BLOCKS, ROUNDS, WARMUP = 7, 60, 20


async def uncontended_ratio(
    url: str, host: str, port: int, zk: bool
) -> tuple[float, dict[str, float]]:
    """(coord's acquire+release time, its ratio to a raw create+delete pair of each raw
    client): the median over alternating blocks of each, every client open throughout.
    On etcd the raw pairs are made with aetcd (grpc.aio) and with coord's own gRPC
    transport (``coord/backends/etcd/_grpc/``): the same transport as coord's."""
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(coord.connect(url, ttl=10))
        mutex = client.mutex(f"u{uuid.uuid4().hex[:8]}")

        async def mine(rounds: int) -> float:
            t0 = time.perf_counter()
            for _ in range(rounds):
                await mutex.acquire()
                await mutex.release()
            return (time.perf_counter() - t0) / rounds

        if zk:
            kazoo = KazooClient(hosts=f"{host}:{port}")
            await anyio.to_thread.run_sync(kazoo.start)
            stack.callback(kazoo.close)
            stack.callback(kazoo.stop)

            async def kazoo_pairs(rounds: int) -> float:
                return await anyio.to_thread.run_sync(zk_raw_pairs, kazoo, rounds)

            raws = {"kazoo": kazoo_pairs}
        else:
            etcd = await stack.enter_async_context(aetcd.Client(host=host, port=port))
            channel = await stack.enter_async_context(Channel(host, port))
            kv = rpc.KVStub(channel)

            async def aetcd_pairs(rounds: int) -> float:
                return await etcd_raw_pairs(etcd, rounds)

            async def own_pairs(rounds: int) -> float:
                return await etcd_own_pairs(kv, rounds)

            raws = {"coord's transport": own_pairs, "aetcd": aetcd_pairs}

        await mine(WARMUP)
        for pairs in raws.values():
            await pairs(WARMUP)
        mines: list[float] = []
        times: dict[str, list[float]] = {name: [] for name in raws}
        for _ in range(BLOCKS):
            mines.append(await mine(ROUNDS))
            for name, pairs in raws.items():
                times[name].append(await pairs(ROUNDS))
        median = statistics.median(mines)
        return median, {name: median / statistics.median(t) for name, t in times.items()}


async def etcd_raw_pairs(client: aetcd.Client, rounds: int) -> float:
    key = f"raw-{uuid.uuid4().hex[:6]}".encode()
    t0 = time.perf_counter()
    for _ in range(rounds):
        await client.put(key, b"")
        await client.delete(key)
    return (time.perf_counter() - t0) / rounds


async def etcd_own_pairs(kv: Any, rounds: int) -> float:
    key = f"raw-{uuid.uuid4().hex[:6]}".encode()
    t0 = time.perf_counter()
    for _ in range(rounds):
        await kv.Put(rpc.PutRequest(key=key, value=b""), timeout=10)
        await kv.DeleteRange(rpc.DeleteRangeRequest(key=key), timeout=10)
    return (time.perf_counter() - t0) / rounds


def zk_raw_pairs(client: KazooClient, rounds: int) -> float:
    base = f"/raw-{uuid.uuid4().hex[:6]}"
    client.ensure_path(base)
    t0 = time.perf_counter()
    for _ in range(rounds):
        path = client.create(f"{base}/n", ephemeral=True, sequence=True)
        client.delete(path)
    elapsed = time.perf_counter() - t0
    client.delete(base)
    return elapsed / rounds


def cohort(k: int) -> str:
    return f"coord cohort (local_handoff={k})"


TOOZ_ETCD = "tooz (etcd3gw driver)"
TOOZ_ZK = "tooz (zookeeper driver)"


# -- one store -----------------------------------------------------------------------------


async def measure(
    store: str, url: str, endpoint: str, ns: list[int], seconds: float, ks: list[int]
) -> list[Row]:
    zk = store == "ZooKeeper"
    host, port = endpoint.removeprefix("zk:").rsplit(":", 1)
    rows: list[Row] = []
    if zk:
        floor = await anyio.to_thread.run_sync(zk_floor_sync, f"{host}:{port}", 200)
    else:
        floor = await etcd_floor(host, int(port), 200)
    rows.append(Row(store, "floor (raw handoff chain)", 0, 1 / floor))
    peer = "kazoo.Lock" if zk else "aetcd.Lock"
    tooz_lock = TOOZ_ZK if zk else TOOZ_ETCD
    for n in ns:
        cohorts = {cohort(k): k for k in ks}
        for lock in ("coord.Mutex", *cohorts, peer, tooz_lock):
            waits: list[float] = []
            before = await notifications(endpoint)
            requests_before = await requests_received(endpoint)
            cpu0, t0 = time.process_time(), time.perf_counter()
            deadline = t0 + seconds
            if lock == "coord.Mutex":
                await coord_run(url, n, deadline, waits)
            elif lock in cohorts:
                await coord_run(url, n, deadline, waits, local_handoff=cohorts[lock])
            elif lock == tooz_lock:
                tooz_url = tooz_peer.tooz_url(zk, host, int(port))
                await anyio.to_thread.run_sync(tooz_run_sync, tooz_url, n, deadline, waits)
            elif zk:
                await anyio.to_thread.run_sync(kazoo_run_sync, f"{host}:{port}", n, deadline, waits)
            else:
                await aetcd_run(host, int(port), n, deadline, waits)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            msgs = await notifications(endpoint) - before
            requests = await requests_received(endpoint) - requests_before
            count = max(len(waits), 1)
            rows.append(
                Row(
                    store,
                    lock,
                    n,
                    len(waits) / elapsed,
                    waits,
                    msgs / count,
                    cpu / count * 1000,
                    requests / count,
                )
            )
            print(" | ".join(rows[-1].cells()), flush=True)
    mine, ratios = await uncontended_ratio(url, host, int(port), zk)
    against = "; ".join(f"{ratio:.2f} ({name})" for name, ratio in ratios.items())
    rows.append(Row(store, f"uncontended coord / two raw round trips = {against}", 1, 1 / mine))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(dict.fromkeys(r.store for r in rows))  # in the order measured
    fig, axes = plt.subplots(1, len(stores), figsize=(6 * len(stores), 4), squeeze=False)
    for ax, store in zip(axes[0], stores, strict=True):
        mine = [r for r in rows if r.store == store and r.contenders > 0 and r.waits]
        for lock in sorted({r.lock for r in mine}):
            points = sorted((r.contenders, r.rate) for r in mine if r.lock == lock)
            color = (
                "tab:green"
                if lock.startswith("coord cohort")
                else "tab:blue"
                if lock.startswith("coord")
                else "tab:red"
                if lock.startswith("tooz")
                else "tab:orange"
            )
            style = ":" if lock.startswith("coord cohort") and lock != cohort(COHORT_K[0]) else "-"
            ax.plot(
                *zip(*points, strict=True), marker="o", label=lock, color=color, linestyle=style
            )
        ax.set_yscale("log")
        for r in rows:
            if r.store == store and r.lock.startswith("floor"):
                ax.axhline(r.rate, linestyle="--", color="gray", label="handoff floor")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("contenders (over min(N, 8) clients)")
        ax.set_ylabel("acquisitions/s")
        ax.set_title(store)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--cohort-k", type=int, nargs="+", default=COHORT_K)
    args = parser.parse_args()
    rows: list[Row] = []
    with production_server("etcd") as etcd:
        rows += anyio.run(
            measure,
            "etcd",
            etcd.url + "/bench",
            etcd.endpoint,
            args.contenders,
            args.seconds,
            args.cohort_k,
        )
    with production_server("zk") as zk:
        rows += anyio.run(
            measure,
            "ZooKeeper",
            zk.url + "/bench",
            f"zk:{zk.endpoint}",
            args.contenders,
            args.seconds,
            args.cohort_k,
        )
    text = table(rows)
    command = "python benchmarks/suite.py " + " ".join(sys.argv[1:])
    (HERE / "results.md").write_text(f"`{command.strip()}`\n\n{text}\n")
    plot(rows, HERE / "results.png")
    print(text)


if __name__ == "__main__":
    main()
