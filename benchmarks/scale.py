"""Scale curves (issue 9): time and client memory per waiter, and per held lock.

Starts a throwaway etcd and ZooKeeper and measures coord's strict Mutex, then tooz's lock
(OpenStack's coordination library, its etcd3gw and zookeeper drivers) the same way:

* **waiters** — one client holds a mutex while W tasks (over 4 clients) queue on it:
  the time to register them all (per waiter), the client memory each costs (Python heap,
  tracemalloc, in a second pass of the same run so the timing pass is not slowed down),
  then the drain: the time per handoff until the queue is empty;
* **locks** — one task of one client acquires L different mutexes one after the other and
  holds them all: the time per acquire, the memory per held lock, the time per release.

tooz is synchronous: a tooz waiter is an OS thread blocked in ``acquire`` (over 4
coordinators, each with its heartbeat thread), so the waiter cases stop at
``TOOZ_MAX_WAITERS`` threads and say so; the heap measured is the Python heap, which
leaves out each thread's stack. Its etcd lock has no queue: a waiter is "registered" once
it has made its first attempt (the server's Txn count shows it), and then polls. Its held
locks on etcd each have a lease that the coordinator's heartbeat refreshes one HTTP request
at a time; a lock whose lease ran out is counted as lost (its release finds it gone).

Writes ``benchmarks/scale.md`` and prints it. Compare rows of one run.

    python benchmarks/scale.py                                  # a few minutes
    python benchmarks/scale.py --waiters 10 100 --locks 100 1000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from _stores import production_server
from kazoo.client import KazooClient

import coord
from coord._locks.hold import GUARD_DELAY
from coord.testing import wait_for_waiters
from coord.testing._metrics import parse_metric

sys.path.insert(0, str(Path(__file__).parent))
import tooz_peer
from mutex_bench import fetch_metrics, server_watches

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

HERE = Path(__file__).parent
TOP = 0  # --heap-top: print the files that hold the most heap at each sample
#: The most tooz waiters measured: each is a thread blocked in acquire. (1,000 polling
#: threads on etcd had not drained after 5 minutes in one run, on 2 cores.)
TOOZ_MAX_WAITERS = 100


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

        answered = count_registrations(clients, count)
        with Heap(trace) as heap:
            async with anyio.create_task_group() as tg:
                t0 = time.perf_counter()
                for i in range(count):
                    tg.start_soon(waiter, clients[i % len(clients)])
                # The time until every registration was answered to its caller: the
                # store's work and the client's, without the listing below (which reads
                # the whole queue, again and again during the burst).
                await answered.wait()
                registered = time.perf_counter() - t0
                await wait_for_waiters(clients[0], name, count + 1)
                await anyio.sleep(GUARD_DELAY + 0.5)  # every waiter has its guard watch
                heap.sample()
                t1 = time.perf_counter()
                await holder.release()
                await drained.wait()
                drain = time.perf_counter() - t1
    return registered / count, heap.grown / count, drain / count


def count_registrations(clients: list[coord.Client], count: int) -> anyio.Event:
    """An event set once the clients' backends have answered *count* registrations
    (each backend's ``register`` wrapped: a benchmark's instrument, not an API)."""
    answered = anyio.Event()
    done = 0
    for client in clients:
        backend = client.backend
        register = backend.register

        async def counted(*args: Any, _register: Any = register, **kwargs: Any) -> Any:
            nonlocal done
            position = await _register(*args, **kwargs)
            done += 1
            if done == count:
                answered.set()
            return position

        backend.register = counted  # type: ignore[method-assign]
    return answered


async def locks(url: str, count: int, trace: bool, endpoint: str = "") -> tuple[float, ...]:
    """(seconds per acquire, heap bytes per held lock, seconds per release, seconds from
    the last acquire until the server holds every hold's guard watch)."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    async with coord.connect(url, ttl=60) as client:
        mutexes = [client.mutex(f"{prefix}/{i}") for i in range(count)]
        before = await server_watches(endpoint)
        with Heap(trace) as heap:
            t0 = time.perf_counter()
            for mutex in mutexes:
                await mutex.acquire()
            last = time.perf_counter()
            acquired = last - t0
            # A hold arms its guard watch once it has existed for GUARD_DELAY: count the
            # server's watches (this is a benchmark: polling it is fine) until all are.
            with anyio.move_on_after(GUARD_DELAY + 60):
                while await server_watches(endpoint) < before + count:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # the server has no event for it
            guarded = time.perf_counter() - last
            await anyio.sleep(max(0.0, GUARD_DELAY + 0.5 - guarded))
            heap.sample()
            t1 = time.perf_counter()
            for mutex in mutexes:
                await mutex.release()
            released = time.perf_counter() - t1
    return acquired / count, heap.grown / count, released / count, guarded


# -- tooz: the same cases, in worker threads (its API is synchronous) ----------------------


class Registered:
    """A count that grows by one per tooz waiter that has made its first attempt: on
    ZooKeeper the lock's children (kazoo's lock queues); on etcd the server's Txn count
    (tooz's etcd lock has no queue: an attempt is a compare-and-put that failed)."""

    def __init__(self, endpoint: str, name: str) -> None:
        self.endpoint = endpoint
        self.zk: KazooClient | None = None
        if endpoint.startswith("zk:"):
            self.zk = KazooClient(hosts=endpoint[3:])
            self.zk.start()
            self.path = f"{tooz_peer.ZK_LOCKS}/{name}"

    def __call__(self) -> int:
        if self.zk is None:
            text = fetch_metrics(self.endpoint)
            return int(parse_metric(text, "grpc_server_msg_received_total", grpc_method="Txn"))
        return len(self.zk.get_children(self.path)) if self.zk.exists(self.path) else 0

    def close(self) -> None:
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()


def tooz_waiters(url: str, endpoint: str, count: int, trace: bool) -> tuple[float, float, float]:
    """(seconds per first attempt, heap bytes per waiter, seconds per handoff)."""
    name = f"w{uuid.uuid4().hex[:8]}"
    clients = tooz_peer.coordinators(url, 4)
    registered = Registered(endpoint, name)
    try:
        holder = clients[0].get_lock(name.encode())
        holder.acquire(blocking=True)

        def waiter(lock: Any) -> None:
            lock.acquire(blocking=True)
            lock.release()

        with Heap(trace) as heap:
            before = registered()
            t0 = time.perf_counter()
            # A waiter's heap: its lock object (as coord's waiter makes its mutex), its thread.
            locks = [clients[i % len(clients)].get_lock(name.encode()) for i in range(count)]
            threads = [threading.Thread(target=waiter, args=(lock,)) for lock in locks]
            for thread in threads:
                thread.start()
            while registered() < before + count:
                time.sleep(0.01)
            first = time.perf_counter() - t0
            heap.sample()
            t1 = time.perf_counter()
            holder.release()
            for thread in threads:
                thread.join()
            drain = time.perf_counter() - t1
    finally:
        registered.close()
        tooz_peer.stop(clients)
    return first / count, heap.grown / count, drain / count


def tooz_locks(url: str, count: int, trace: bool) -> tuple[float, float, float, int]:
    """(seconds per acquire, heap bytes per held lock, seconds per release, locks lost)."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    (client,) = tooz_peer.coordinators(url, 1)
    try:
        with Heap(trace) as heap:
            t0 = time.perf_counter()
            # Counted in the heap: a tooz lock object is where its hold's state lives
            # (coord's mutex handles are made before, and their holds' state after).
            held = [client.get_lock(f"{prefix}-{i}".encode()) for i in range(count)]
            for lock in held:
                lock.acquire(blocking=True)
            acquired = time.perf_counter() - t0
            heap.sample()
            t1 = time.perf_counter()
            lost = sum(not lock.release() for lock in held)
            released = time.perf_counter() - t1
    finally:
        tooz_peer.stop([client])
    return acquired / count, heap.grown / count, released / count, lost


# -- one store -----------------------------------------------------------------------------


def row(store: str, kind: str, n: int, first: str, a: float, b: float, memory: float) -> list[str]:
    return [
        store,
        kind,
        f"{n:,}",
        f"{first} {a * 1000:.2f} ms",
        f"{b * 1000:.2f} ms",
        f"{memory / 1024:.1f} KB",
    ]


async def traced(func: Callable[[bool], Awaitable[Any]]) -> tuple[Any, Any]:
    """func(False) (timing), then func(True) under tracemalloc (memory)."""
    timed = await func(False)
    tracemalloc.start()
    try:
        return timed, await func(True)
    finally:
        tracemalloc.stop()


async def measure(
    store: str, url: str, endpoint: str, ws: list[int], ls: list[int]
) -> list[list[str]]:
    rows = []
    for kind, sizes, func, first, last in (
        ("waiters on one mutex", ws, waiters, "register", "handoff"),
        ("mutexes held by one client", ls, locks, "acquire", "release"),
    ):
        for n in sizes:

            async def run(trace: bool, func: Any = func, n: int = n) -> Any:
                if func is locks:
                    return await locks(url, n, trace, endpoint)
                return (*await func(url, n, trace), None)

            (a, _, b, guarded), (_, memory, _, _) = await traced(run)
            rows.append(row(store, kind, n, first, a, b, memory))
            if guarded is not None:
                rows[-1][4] += f"; all guarded {guarded:.1f} s after the last acquire"
            print(" | ".join(rows[-1]), f"({last})", flush=True)

    zk = endpoint.startswith("zk:")
    host, port = endpoint.removeprefix("zk:").rsplit(":", 1)
    tooz_url = tooz_peer.tooz_url(zk, host, int(port))
    driver = "zookeeper" if zk else "etcd3gw"
    kind = f"tooz ({driver}): waiters on one lock"
    for n in ws:
        if n > TOOZ_MAX_WAITERS:
            rows.append(
                [store, kind, f"{n:,}"]
                + [f"not measured: {n:,} threads (a tooz waiter is a thread)"]
                + ["-"] * 2
            )
            print(" | ".join(rows[-1]), flush=True)
            continue

        async def run_waiters(trace: bool, n: int = n) -> Any:
            return await anyio.to_thread.run_sync(tooz_waiters, tooz_url, endpoint, n, trace)

        (a, _, b), (_, memory, _) = await traced(run_waiters)
        first = "first attempt" if not zk else "register"
        rows.append(row(store, kind, n, first, a, b, memory))
        rows[-1][-1] += " + a thread's stack"
        print(" | ".join(rows[-1]), "(handoff)", flush=True)
    kind = f"tooz ({driver}): locks held by one coordinator"
    for n in ls:

        async def run_locks(trace: bool, n: int = n) -> Any:
            return await anyio.to_thread.run_sync(tooz_locks, tooz_url, n, trace)

        (a, _, b, lost), (_, memory, _, lost2) = await traced(run_locks)
        rows.append(row(store, kind, n, "acquire", a, b, memory))
        if lost or lost2:
            rows[-1][4] += f" ({lost:,} / {lost2:,} lost before release)"
        print(" | ".join(rows[-1]), "(release)", flush=True)
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
    with production_server("etcd") as etcd:
        rows += anyio.run(
            measure, "etcd", etcd.url + "/scale", etcd.endpoint, args.waiters, args.locks
        )
    with production_server("zk") as zk:
        rows += anyio.run(
            measure, "ZooKeeper", zk.url + "/scale", f"zk:{zk.endpoint}", args.waiters, args.locks
        )
    header = ["store", "case", "n", "time per item", "then per item", "client heap per item"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    command = "python benchmarks/scale.py " + " ".join(sys.argv[1:])
    text = "\n".join(lines)
    note = (
        "(waiters: register, then handoff while draining; mutexes: acquire, then release;"
        " tooz: see the script's docstring)"
    )
    (HERE / "scale.md").write_text(f"`{command.strip()}` {note}\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
