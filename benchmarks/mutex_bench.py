"""Benchmark: coord's Mutex against the peer lock of the same store, in the same run.

On etcd the peer is aetcd's Lock; on ZooKeeper it is kazoo's Lock (threaded: one thread
per contender). Each contender has its own client (its own session) and loops acquire ->
release for a fixed time. Printed per (lock, contenders): acquisitions/s, wait p50/p99,
max/mean wait (fairness: a newcomer jumping the queue makes the max wait explode), and
the server's notifications per acquisition (etcd: Watch messages sent; ZooKeeper: watch
events fired) — a herd shows as one release waking every waiter. Compare ratios within one
run; absolute numbers depend on the machine.

Each store runs as production runs it (etcd's default fsync; ZooKeeper with
``forceSync=yes`` on the JVM's defaults). Under the table, the floor of a handoff chain
measured in the same run: keys deleted one after the other, each delete sent when the
watch event of the one before arrives (delete -> watch event -> the next delete), by the
raw library (aetcd, kazoo), one client, nothing else: what any lock that hands over
through a watch must pay per handoff, and coord's contended rate as a share of it.

    python benchmarks/mutex_bench.py                       # starts a throwaway etcd
    python benchmarks/mutex_bench.py --store zk            # starts a throwaway ZooKeeper
    python benchmarks/mutex_bench.py --url etcd://127.0.0.1:2379 --seconds 10
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import aetcd
import anyio
from _stores import production_server
from kazoo.client import KazooClient

import coord
from coord.backends.zookeeper._faults import notifications_sent, server_counters
from coord.testing._metrics import parse_metric, watch_messages_sent

Contender = Callable[[float, list[float]], Coroutine[Any, Any, None]]


@dataclass
class Result:
    lock: str
    contenders: int
    acquisitions: int
    seconds: float
    waits: list[float]
    watch_msgs: int

    def row(self) -> str:
        waits = sorted(self.waits)
        p50 = waits[len(waits) // 2] * 1000
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000
        fairness = max(waits) / statistics.mean(waits) if statistics.mean(waits) else 0.0
        return (
            f"| {self.lock} | {self.contenders} | {self.acquisitions / self.seconds:,.0f} "
            f"| {p50:.1f} ms | {p99:.1f} ms | {fairness:.1f} "
            f"| {self.watch_msgs / max(self.acquisitions, 1):.1f} |"
        )


async def notifications(endpoint: str) -> int:
    if endpoint.startswith("zk:"):
        host, port = endpoint[3:].rsplit(":", 1)
        return await anyio.to_thread.run_sync(notifications_sent, [(host, int(port))])
    return await watch_messages_sent(endpoint)


def _zk_packets_received(host: str, port: int) -> int:
    return sum(m.get("zk_packets_received", 0) for m in server_counters([(host, port)]))


def fetch_metrics(endpoint: str) -> str:
    """etcd's /metrics text. Blocks."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _grpc_messages_received(endpoint: str) -> int:
    return int(parse_metric(fetch_metrics(endpoint), "grpc_server_msg_received_total"))


def _etcd_watchers(endpoint: str) -> int:
    return int(parse_metric(fetch_metrics(endpoint), "etcd_debugging_mvcc_watcher_total"))


def _zk_watches(host: str, port: int) -> int:
    return sum(c.get("zk_watch_count", 0) for c in server_counters([(host, port)]))


async def server_watches(endpoint: str) -> int:
    """The watches the server holds now, of every client (etcd: its watcher gauge;
    ZooKeeper: ``zk_watch_count``, one per watched path and session)."""
    if endpoint.startswith("zk:"):
        host, port = endpoint[3:].rsplit(":", 1)
        return await anyio.to_thread.run_sync(_zk_watches, host, int(port))
    return await anyio.to_thread.run_sync(_etcd_watchers, endpoint)


async def requests_received(endpoint: str) -> int:
    """Every request the server has received so far, of every client (etcd: gRPC messages
    received, gateway requests and lease keep-alives included; ZooKeeper: packets received,
    pings included)."""
    if endpoint.startswith("zk:"):
        host, port = endpoint[3:].rsplit(":", 1)
        return await anyio.to_thread.run_sync(_zk_packets_received, host, int(port))
    return await anyio.to_thread.run_sync(_grpc_messages_received, endpoint)


async def run(
    name: str, contenders: int, seconds: float, endpoint: str, contend: Contender
) -> Result:
    waits: list[float] = []
    before = await notifications(endpoint)
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(contenders):
            tg.start_soon(contend, start + seconds, waits)
    elapsed = time.perf_counter() - start
    msgs = await notifications(endpoint) - before
    return Result(name, contenders, len(waits), elapsed, waits, msgs)


def coord_contender(url: str, key: str) -> Contender:
    async def contend(deadline: float, waits: list[float]) -> None:
        async with coord.connect(url, ttl=10) as client:
            mutex = client.mutex(key)
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await mutex.acquire()
                waits.append(time.perf_counter() - t0)
                await mutex.release()

    return contend


def aetcd_contender(
    host: str, port: int, key: str
) -> Callable[[float, list[float]], Coroutine[Any, Any, None]]:
    async def contend(deadline: float, waits: list[float]) -> None:
        async with aetcd.Client(host=host, port=port) as client:
            lock = client.lock(key.encode(), ttl=10)
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await lock.acquire(timeout=None)
                waits.append(time.perf_counter() - t0)
                await lock.release()

    return contend


def kazoo_contender(hosts: str, key: str) -> Contender:
    def contend_in_thread(deadline: float, waits: list[float]) -> None:
        client = KazooClient(hosts=hosts, timeout=10)
        client.start()
        try:
            lock = client.Lock(f"/bench/{key}")
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                lock.acquire()
                waits.append(time.perf_counter() - t0)
                lock.release()
        finally:
            client.stop()
            client.close()

    async def contend(deadline: float, waits: list[float]) -> None:
        await anyio.to_thread.run_sync(contend_in_thread, deadline, waits)

    return contend


HANDOFFS = 1000


async def etcd_handoff_floor(host: str, port: int) -> float:
    """Handoffs per second of a chain of deletes driven by one watch (aetcd)."""
    prefix = f"chain-{uuid.uuid4().hex[:8]}/".encode()
    keys = [prefix + b"%08d" % n for n in range(HANDOFFS + 1)]
    async with aetcd.Client(host=host, port=port) as client:
        for key in keys:
            created = await client.put(key, b"")
        revision = created.header.revision
        watch = await client.watch(
            prefix, range_end=prefix[:-1] + b"0", start_revision=revision + 1
        )
        started = time.perf_counter()
        await client.delete(keys[0])
        gone = 0
        async for _event in watch:
            gone += 1
            if gone == len(keys):
                break
            await client.delete(keys[gone])
        took = time.perf_counter() - started
        await watch.cancel()
    return HANDOFFS / took


def _kazoo_handoff_floor(hosts: str) -> float:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start()
    try:
        base = f"/chain-{uuid.uuid4().hex[:8]}"
        client.ensure_path(base)
        paths = [f"{base}/{n:08d}" for n in range(HANDOFFS + 1)]
        for path in paths:
            client.create(path, b"")
        done = threading.Event()

        def armed(n: int) -> Callable[[Any], None]:
            def deleted(_: Any) -> None:  # on kazoo's event thread
                if n + 1 < len(paths):
                    client.delete_async(paths[n + 1])
                else:
                    done.set()

            return deleted

        for n, path in enumerate(paths):
            client.exists(path, watch=armed(n))
        started = time.perf_counter()
        client.delete_async(paths[0])
        done.wait(120)
        return HANDOFFS / (time.perf_counter() - started)
    finally:
        client.stop()
        client.close()


async def handoff_floor(endpoint: str) -> float:
    host, port = endpoint.removeprefix("zk:").rsplit(":", 1)
    if endpoint.startswith("zk:"):
        return await anyio.to_thread.run_sync(_kazoo_handoff_floor, f"{host}:{port}")
    return await etcd_handoff_floor(host, int(port))


async def main(url: str, endpoint: str, contenders: list[int], seconds: float) -> None:
    zk = endpoint.startswith("zk:")
    host, port = endpoint.removeprefix("zk:").rsplit(":", 1)
    peer = "kazoo.Lock" if zk else "aetcd.Lock"
    print(f"{'ZooKeeper' if zk else 'etcd'} at {host}:{port}; {seconds:.0f} s per row")
    print(
        "| lock | contenders | acquisitions/s | p50 wait | p99 wait | max/mean wait "
        "| server notifications per acquisition |"
    )
    print("|---|---|---|---|---|---|---|")
    rates: dict[int, float] = {}
    for n in contenders:
        for name in ("coord.Mutex", peer):
            key = f"bench-{uuid.uuid4().hex[:8]}"
            if name == "coord.Mutex":
                contend = coord_contender(url, key)
            elif zk:
                contend = kazoo_contender(f"{host}:{port}", key)
            else:
                contend = aetcd_contender(host, int(port), key)
            result = await run(name, n, seconds, endpoint, contend)
            print(result.row(), flush=True)
            if name == "coord.Mutex" and n > 1:  # one contender hands over to nobody
                rates[n] = result.acquisitions / result.seconds
    floor = await handoff_floor(endpoint)
    print(
        f"\nhandoff chain floor ({peer.split('.')[0]}, delete -> watch event -> next delete): "
        f"{floor:,.0f} handoffs/s; coord.Mutex / floor: "
        + ", ".join(f"{rate / floor:.2f} at {n} contenders" for n, rate in rates.items())
    )


@contextlib.contextmanager
def store_endpoint(url: str | None, store: str) -> Iterator[tuple[str, str]]:
    """(coord URL, endpoint); the endpoint is ``host:port``, ``zk:host:port`` for zk."""
    if url:
        parsed = coord._core.url.parse_url(url)
        host, port = parsed.hosts[0]
        yield url, f"{'zk:' if parsed.scheme == 'zk' else ''}{host}:{port}"
        return
    if store == "zk":
        with production_server("zk") as zk:
            yield zk.url + "/bench", f"zk:{zk.endpoint}"
        return
    with production_server("etcd") as server:
        yield server.url + "/bench", server.endpoint


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["etcd", "zk"], default="etcd")
    parser.add_argument("--url", help="an etcd:// or zk:// URL (default: start a server)")
    parser.add_argument("--contenders", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with store_endpoint(args.url, args.store) as (url, endpoint):
        anyio.run(main, url, endpoint, args.contenders, args.seconds)
